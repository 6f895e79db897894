"""Submit a written DAG directory: through the schedd where one answers, else print how.

On an access point ``submit_dag`` goes through ``htcondor2.Submit.from_dag`` and
``Schedd().submit``; elsewhere (a laptop, the tests) it prints the exact
``condor_submit_dag`` command to run on the access point. A DAG that failed part-way left a
rescue DAG (``campaign.dag.rescueNNN``): resubmitting the same DAG file makes DAGMan run the
newest rescue DAG, so the finished ranges are skipped and the chain continues.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from submit import constants as C
from submit.errors import DagDirError, SubmitError

_RESCUE = re.compile(re.escape(C.DAG_FILE + C.RESCUE_SUFFIX) + r"(\d{3})$")


def find_rescue(dag_dir: str | Path) -> Path | None:
    """The newest rescue DAG in ``dag_dir`` (the one DAGMan would run), or None.

    Stricter than ``htcondor2.dags.find_rescue_file``, which globs ``<dag>.rescue*`` and so
    also matches e.g. a backup named ``campaign.dag.rescue001.orig``.
    """
    found = []
    for path in Path(dag_dir).glob(C.DAG_FILE + C.RESCUE_SUFFIX + "*"):
        m = _RESCUE.match(path.name)
        if m:
            found.append((int(m.group(1)), path))
    return max(found)[1] if found else None


def rescue_done_nodes(rescue_file: str | Path) -> list[str]:
    """Names of the nodes a rescue DAG marks DONE."""
    done = []
    for line in Path(rescue_file).read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].upper() == "DONE":
            done.append(parts[1])
    return done


def submit_options(batch_name: str, *, force: bool = False) -> dict[str, Any]:
    """``Submit.from_dag`` options (the same as the printed command's flags)."""
    options: dict[str, Any] = {"BatchName": batch_name}
    if force:
        options["Force"] = True
    return options


def submit_command(dag_dir: str | Path, batch_name: str, *, force: bool = False) -> str:
    """The shell command that submits the DAG on an access point.

    It runs from the DAG directory because the DAG names its submit files, config and
    status file relative to DAGMan's working directory.
    """
    flags = ["-batch-name", batch_name] + (["-force"] if force else [])
    return f"cd {shlex.quote(str(dag_dir))} && condor_submit_dag {shlex.join(flags)} {C.DAG_FILE}"


@dataclass(frozen=True)
class Submitted:
    cluster: int | None
    """The DAGMan job's cluster id; None when no schedd answered and the command was printed."""
    command: str


def submit_dag(
    dag_dir: str | Path,
    batch_name: str,
    *,
    force: bool = False,
    schedd_factory: Callable[[], Any] | None = None,
    from_dag: Callable[[str, dict], Any] | None = None,
    say: Callable[[str], None] = print,
) -> Submitted:
    """Submit ``dag_dir/campaign.dag``; without a reachable schedd print the command instead.

    ``schedd_factory`` and ``from_dag`` default to ``htcondor2.Schedd`` and
    ``htcondor2.Submit.from_dag`` (arguments so tests can stand in for a pool).
    """
    dag_dir = Path(dag_dir)
    if not (dag_dir / C.DAG_FILE).is_file():
        raise DagDirError(f"{dag_dir / C.DAG_FILE} not found: write the DAG first")
    command = submit_command(dag_dir, batch_name, force=force)
    if schedd_factory is None or from_dag is None:
        import htcondor2

        schedd_factory = schedd_factory or htcondor2.Schedd
        from_dag = from_dag or htcondor2.Submit.from_dag
    try:
        schedd = schedd_factory()
    except Exception as exc:  # HTCondorException: no pool configured or schedd down
        say(f"No HTCondor schedd reachable from here ({exc}).")
        say("On the access point, submit the DAG with:")
        say(f"  {command}")
        return Submitted(cluster=None, command=command)
    with _working_dir(dag_dir):
        try:
            description = from_dag(C.DAG_FILE, submit_options(batch_name, force=force))
            result = schedd.submit(description)
        except Exception as exc:
            raise SubmitError(
                f"submitting {dag_dir / C.DAG_FILE} failed: {exc}. Try by hand: {command}"
            ) from None
    cluster = int(result.cluster())
    say(f"Submitted {dag_dir / C.DAG_FILE} as DAGMan job {cluster} (batch {batch_name}).")
    say(f"Follow it with: python -m submit status {dag_dir}")
    return Submitted(cluster=cluster, command=command)


@contextmanager
def _working_dir(path: Path) -> Iterator[None]:
    """DAGMan resolves the DAG's relative paths against the directory it was submitted from."""
    old = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)
