"""Every file name, directory name and magic number the grid workflow relies on.

The one place for them: ``submit/`` (on the access point, no torch) and ``muongen`` (the
node, ``muongen chain``, the exit codes of every verb) both import this module, which
needs nothing but Python itself.

A DAG directory written by ``python -m submit write`` looks like this (htmap style: one
place to read what lives where)::

    DIR/
      campaign.dag              the DAG (DAG_FILE); rescue DAGs appear as campaign.dag.rescue001
      campaign.dag.status       DAGMan's node status file (STATUS_FILE)
      dagman.config             DAGMan settings, e.g. DAGMAN_MAX_JOBS_IDLE (written by htcondor2)
      range_0000000-0000999.sub one submit description per node
      node.sh                   the node wrapper, copied from jobs/ (NODE_WRAPPER)
      post_check.py             the POST script, copied from jobs/ (POST_SCRIPT)
      campaign.yaml             the campaign the DAG was written from (CAMPAIGN_COPY)
      logs/                     per-node HTCondor log, stdout/stderr per attempt, POST output
      receipts/                 each finished node's manifest copy, for the POST check

A sweep's DAG directory (a campaign with a ``sweep:`` block) holds one chain per member as a
sub-DAG, each laid out as above, plus the nodes that score and rank them::

    DIR/
      campaign.dag              SUBDAG EXTERNAL chain_NN per member (CATEGORY chains, MAXJOBS
                                dagman.max_running), eval_NN after each, FINAL compare
      chains/<member>/          the member's chain: a whole DAG directory as above (CHAINS_DIR)
      eval_NN.sub               the member's evaluate node (EVAL_PREFIX)
      compare.sub               the FINAL node (COMPARE_NODE; htcondor2.dags does not write it)
      evaluate.sh, compare.sh, final_check.py   copied from jobs/
      sweep.json                node name -> member (SWEEP_INDEX), for status
      metrics/members.json      member -> settings, seed, overrides (MEMBERS_FILE)
      metrics/<member>/metrics.json   each evaluation, sent back by its node (METRICS_DIR)
      board/                    leaderboard.md/.json from the compare node (BOARD_DIR)
"""

from __future__ import annotations

# ----------------------------------------------------------------- the DAG directory
DAG_FILE = "campaign.dag"
STATUS_FILE = DAG_FILE + ".status"
RESCUE_SUFFIX = ".rescue"  # DAGMan names rescue DAGs <DAG_FILE>.rescueNNN
CONDOR_SUB_SUFFIX = ".condor.sub"  # written by condor_submit_dag / Submit.from_dag
CAMPAIGN_COPY = "campaign.yaml"
NODE_WRAPPER = "node.sh"
POST_SCRIPT = "post_check.py"
LOGS_DIR = "logs"
RECEIPTS_DIR = "receipts"
NODE_PREFIX = "range_"  # node name = NODE_PREFIX + range label; also the .sub file's stem
CATEGORY = "train"  # the DAGMan category every training node belongs to (MAXJOBS throttle)
STATUS_UPDATE_S = 60  # minimum seconds between node status file updates

# ----------------------------------------------------------------- a sweep's DAG directory
CHAINS_DIR = "chains"  # chains/<member>/ holds the member's chain DAG
CHAIN_PREFIX = "chain_"  # SUBDAG node of member NN: chain_NN
EVAL_PREFIX = "eval_"  # evaluate node of member NN: eval_NN (and eval_NN.sub)
COMPARE_NODE = "compare"  # the FINAL node; compare.sub
CHAINS_CATEGORY = "chains"  # the category of the SUBDAG nodes: MAXJOBS = chains at once
EVALUATE_WRAPPER = "evaluate.sh"
COMPARE_WRAPPER = "compare.sh"
FINAL_CHECK = "final_check.py"
SWEEP_INDEX = "sweep.json"
MEMBERS_FILE = "members.json"
METRICS_DIR = "metrics"
METRICS_FILE = "metrics.json"
METRICS_RECEIPT = "metrics-receipt.json"  # the evaluate node's copy for the access point
BOARD_DIR = "board"

# ----------------------------------------------------------------- the job's scratch dir
# The node wrapper's side of the contract (jobs/node.sh -> muongen chain --node):
RECEIPT_FILE = "receipt.json"  # a copy of <range>.json that comes back to the access point
RUN_DIR = "run-{range}"  # all restartable state of a node; spooled on a self-checkpoint exit
NODE_LOCK = ".muongen-node.lock"  # held by the node process: one node at a time per scratch dir
PROGRESS_FILE = "chain-progress.json"  # muongen chain --local: the workdir's record of ranges

# ----------------------------------------------------------------- exit codes
# What a node (and every muongen verb) exits with, and what DAGMan / muongen chain --local
# do about it: 0 done; 2 a user error no retry fixes (RETRY ... UNLESS-EXIT 2, and the local
# chain stops at once); 85 checkpointed, restart me; 75 held and released later; anything
# else (a crash, a signal, 3 = training diverged) is retried.
EXIT_DONE = 0
EXIT_USER_ERROR = 2  # muongen.errors.MuongenError.exit_code: a bad config, file or checkpoint
EXIT_NOT_SUBMITTED = 3  # python -m submit submit: no schedd here, the command was printed
EXIT_SELF_CHECKPOINT = 85  # checkpoint_exit_code: HTCondor spools RUN_DIR and restarts the job
EXIT_TRANSIENT = 75  # EX_TEMPFAIL: storage unreachable; the job is held, then released later

# ----------------------------------------------------------------- HTCondor hold reasons
HOLD_TRANSFER_OUTPUT = 12  # TransferOutputError (also self-checkpoint transfers)
HOLD_TRANSFER_INPUT = 13  # TransferInputError
HOLD_JOB_POLICY = 3  # JobPolicy: our on_exit_hold, with HoldReasonSubCode = EXIT_TRANSIENT

# ----------------------------------------------------------------- campaign vocabulary
FEDERATION_OSDF = "osdf"  # data URLs osdf:///<base>/...
FEDERATION_LOCAL = "local"  # data URLs file:///<base>/... (muongen chain --local only)
JOB_DURATIONS = ("Medium", "Long")  # OSPool +JobDurationCategory values
RANGE_DIGITS = 7  # range folders are NNNNNNN-NNNNNNN (file numbers, zero padded)
