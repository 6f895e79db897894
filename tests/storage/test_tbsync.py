"""TensorBoard sync: new and grown files are uploaded; restarts never clobber earlier files."""

from __future__ import annotations

import time

from muongen.storage.tbsync import TensorBoardSync
from muongen.storage.tokens import Token


def test_uploads_new_and_grown_files(pelican_federation, tmp_path):
    fed = pelican_federation
    token = Token.from_value(fed.token("storage.read:/icecube storage.modify:/icecube/tb"), "t")
    logs = tmp_path / "tb"
    (logs / "train").mkdir(parents=True)
    ev = logs / "train" / "events.out.tfevents.1.host.1.0"
    ev.write_bytes(b"a" * 100)
    remote = fed.url("/icecube/tb/camp/r0")
    sync = TensorBoardSync(str(logs), remote, every_s=0.05, token=token)
    deadline = time.monotonic() + 5
    while (
        not fed.local("/icecube/tb/camp/r0/train/" + ev.name).exists()
        and time.monotonic() < deadline
    ):
        time.sleep(0.02)
    assert fed.local("/icecube/tb/camp/r0/train/" + ev.name).read_bytes() == b"a" * 100
    puts = len(fed.requests("origin", "PUT"))
    time.sleep(0.2)  # unchanged: nothing uploaded again
    assert len(fed.requests("origin", "PUT")) == puts
    with open(ev, "ab") as f:
        f.write(b"b" * 50)
    (logs / "events.out.tfevents.2.host.1.0").write_bytes(b"c" * 10)
    assert sync.close()
    assert fed.local("/icecube/tb/camp/r0/train/" + ev.name).read_bytes() == b"a" * 100 + b"b" * 50
    assert fed.local("/icecube/tb/camp/r0/events.out.tfevents.2.host.1.0").read_bytes() == b"c" * 10


def test_restart_does_not_clobber(pelican_federation, tmp_path):
    fed = pelican_federation
    token = Token.from_value(fed.token("storage.read:/icecube storage.modify:/icecube/tb"), "t")
    remote = fed.url("/icecube/tb/c")
    first = tmp_path / "job1"
    first.mkdir()
    (first / "events.out.tfevents.1.a.1.0").write_bytes(b"x" * 300)
    TensorBoardSync(str(first), remote, every_s=0, token=token).close()
    # the restarted job has its own (unique) file, plus a shorter copy of the first one
    second = tmp_path / "job2"
    second.mkdir()
    (second / "events.out.tfevents.1.a.1.0").write_bytes(b"x" * 10)
    (second / "events.out.tfevents.9.a.2.0").write_bytes(b"y" * 20)
    sync = TensorBoardSync(str(second), remote, every_s=0, token=token)
    assert sync.sync() == 1
    assert fed.local("/icecube/tb/c/events.out.tfevents.1.a.1.0").read_bytes() == b"x" * 300
    assert fed.local("/icecube/tb/c/events.out.tfevents.9.a.2.0").read_bytes() == b"y" * 20
    assert sync.sync() == 0  # nothing new


def test_sync_survives_faults_and_local_destination(pelican_federation, tmp_path):
    fed = pelican_federation
    token = Token.from_value(fed.token("storage.read:/icecube storage.modify:/icecube/tb"), "t")
    logs = tmp_path / "tb"
    logs.mkdir()
    (logs / "events.out.tfevents.1.h.1.0").write_bytes(b"z" * 64)
    fed.inject("status", method="PUT", status=503)
    fed.inject("drop", method="PUT")
    sync = TensorBoardSync(str(logs), fed.url("/icecube/tb/f"), every_s=0, token=token)
    assert sync.close() and sync.uploads == 1
    local = TensorBoardSync(str(logs), f"file://{tmp_path}/mirror", every_s=0)
    assert local.close()
    assert (tmp_path / "mirror" / "events.out.tfevents.1.h.1.0").read_bytes() == b"z" * 64
