#!/usr/bin/env python3
"""DAGMan POST script of a sweep's FINAL compare node: the DAG's result, not the board's.

    final_check.py --job-return $RETURN --dag-status $DAG_STATUS --failed $FAILED_COUNT

A FINAL node's status is the whole DAG's (HTCondor manual, "FINAL node"): were this script
to return 0 after a member failed, the DAG would count as successful and leave no rescue
DAG to continue from. So: the compare job's own failure is returned as is; otherwise any
failed node (or a DAG removed or aborted) exits 1, after saying that the leaderboard was
still written from the members that finished. Standard library only (the access point).
"""

from __future__ import annotations

import argparse
import sys

# $DAG_STATUS values (HTCondor manual, DAGMan "FINAL node"):
DAG_STATUS = {
    0: "ok",
    1: "error",
    2: "a node failed",
    3: "aborted (ABORT-DAG-ON)",
    4: "removed (condor_rm)",
    5: "a cycle",
    6: "halted",
}


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise SystemExit(f"final_check: {what} {text!r} is not an integer") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--job-return", required=True, help="the compare job's status ($RETURN)")
    parser.add_argument("--dag-status", required=True, help="$DAG_STATUS")
    parser.add_argument("--failed", required=True, help="$FAILED_COUNT: nodes that failed")
    args = parser.parse_args(argv)
    code = _int(args.job_return, "--job-return")
    status = _int(args.dag_status, "--dag-status")
    failed = _int(args.failed, "--failed")
    if code != 0:
        print(f"final_check: the compare job failed (return {code}); no leaderboard")
        return code if 0 < code < 256 else 1
    if failed > 0 or status != 0:
        why = DAG_STATUS.get(status, f"status {status}")
        print(
            f"final_check: leaderboard written from the members that finished; {failed} "
            f"node(s) failed (DAG {why}): the DAG fails so that `python -m submit submit` "
            "continues them from the rescue DAG"
        )
        return 1
    print("final_check: ok: every member trained and evaluated; leaderboard written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
