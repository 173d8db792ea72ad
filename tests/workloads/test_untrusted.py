"""Data sets, checkpoints and hooks that may come from someone else (issue 43): a planted
CIFAR batch or checkpoint never runs its code and ends in one line naming the file; the
checkpoint written never goes through a planted link; a hook spec that names no factory is
one line from the rank."""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import pwd
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.workloads.launch import ROOT, train
from workloads import checkpoint, data
from workloads.models import build_model
from workloads.schemes import hook


class _Planted:
    """Unpickling it runs ``func(arg)`` (what a planted file would do)."""

    def __init__(self, func, arg):
        self.func, self.arg = func, arg

    def __reduce__(self):
        return (self.func, (self.arg,))


def _cifar_dir(tmp_path: Path, batch: bytes) -> Path:
    d = tmp_path / "cifar-10-batches-py"
    d.mkdir()
    for f in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (d / f).write_bytes(batch)
    return d


def _py2_batch(n: int) -> bytes:
    """A batch as the real CIFAR files are: Python 2 ``str`` (BINSTRING) and a numpy 1 array
    (``numpy.core.multiarray._reconstruct``), pickled with protocol 2."""
    class Py2(pickle._Pickler):
        dispatch = dict(pickle._Pickler.dispatch)

        def save_str2(self, obj):
            self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + obj)
            self.memoize(obj)
        dispatch[bytes] = save_str2

    buf = io.BytesIO()
    Py2(buf, protocol=2).dump({b"batch_label": b"training batch 1 of 5", b"labels": [i % 10 for i in range(n)],
                               b"data": np.arange(n * 3072, dtype=np.uint8).reshape(n, 3072),
                               b"filenames": [b"x_%d.png" % i for i in range(n)]})
    return buf.getvalue().replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")


def test_real_cifar_batches_load_through_the_restricted_unpickler(tmp_path):
    from workloads import untrusted  # here, not at the top: the other tests run on code that lacks it

    raw = _py2_batch(4)
    assert b"cnumpy.core.multiarray\n_reconstruct" in raw and pickle.BINSTRING in raw
    _cifar_dir(tmp_path, raw)
    ds = data.load("cifar10", str(tmp_path))
    assert ds.x_train.shape == (20, 3, 32, 32) and ds.y_train.tolist()[:4] == [0, 1, 2, 3]
    py3 = pickle.dumps({b"data": np.zeros((3, 3072), np.uint8), b"labels": np.arange(3).tolist()}, protocol=2)
    assert b"_codecs" in py3  # bytes in a protocol-2 pickle of Python 3
    assert untrusted.load_cifar_pickle(_write(tmp_path / "py3", py3))[b"labels"] == [0, 1, 2]
    scalars = pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": [np.int64(7)]}, protocol=4)
    assert untrusted.load_cifar_pickle(_write(tmp_path / "py3s", scalars))[b"labels"] == [7]


def _write(path: Path, raw: bytes) -> Path:
    path.write_bytes(raw)
    return path


@pytest.mark.parametrize("payload,named", [
    (lambda m: _Planted(os.system, f"touch {m}"), "it names posix.system"),
    (lambda m: _Planted(exec, f"open({str(m)!r}, 'w')"), "it names __builtin__.exec"),  # protocol 2: Python 2 names
    (lambda m: {b"data": np.array([_Planted(os.system, f"touch {m}")], dtype=object)},
     "it holds an array of Python objects"),  # refused at its dtype, before its items
    (lambda m: {b"data": np.array([1, "x"], dtype=object)}, "it holds an array of Python objects"),
    (lambda m: {b"data": np.zeros(2, dtype=[("a", "u1"), ("b", "f4")])}, "it holds an array of dtype |V5"),
])
def test_a_planted_cifar_batch_runs_nothing_and_is_one_line_naming_the_file(tmp_path, payload, named):
    marker = tmp_path / "ran"
    d = _cifar_dir(tmp_path, pickle.dumps(payload(marker), protocol=2))
    with pytest.raises(data.DatasetError) as e:
        data.load("cifar10", str(tmp_path))
    assert not marker.exists(), "the planted batch ran its code"  # first: what the unrestricted pickle.load did
    msg = str(e.value)
    assert msg.startswith(f"cannot read {d / 'data_batch_1'} as a CIFAR batch: {named}") and "\n" not in msg, msg
    assert "never" in msg and "kriz/cifar" in msg


def test_a_cifar_batch_that_is_no_regular_file_or_too_large_is_refused(tmp_path):
    from workloads import untrusted

    d = tmp_path / "cifar-10-batches-py"
    d.mkdir()
    os.mkfifo(d / "data_batch_1")  # would block a plain open
    with pytest.raises(data.DatasetError, match="data_batch_1 as a CIFAR batch: it is a FIFO"):
        data.load("cifar10", str(tmp_path))
    big = _write(tmp_path / "big", pickle.dumps({b"data": b"x" * 4096}, protocol=2))
    with pytest.raises(untrusted.Refused, match="more than the 1,024 bytes it may be"):
        untrusted.load_cifar_pickle(big, limit=1024)
    with untrusted.open_bounded(big, 1024 * 1024) as growing:
        with open(big, "ab") as f:
            f.write(b"\0" * 1024 * 1024)  # grows past the bound after it was checked
        with pytest.raises(untrusted.Refused, match="larger than 1 MiB"):
            growing.read()
    huge = _write(tmp_path / "huge", b"\x80\x02cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n"
                  b"\x8a\x06\x00\x00\x00\x00\x00\x01\x85C\x01b\x87R.")  # an array of 2**40 bytes, empty
    with pytest.raises(untrusted.Refused, match=r"reconstructs an array as \(1099511627776,\)"):
        untrusted.load_cifar_pickle(huge)
    codec = _write(tmp_path / "codec", b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00xX\x04\x00\x00\x00zlib\x86R.")
    with pytest.raises(untrusted.Refused, match="encodes with 'zlib'"):
        untrusted.load_cifar_pickle(codec)


def test_a_rank_ends_a_planted_cifar_batch_in_one_line(tmp_path):
    """`testbed run` checks the batches' names and types only (no data loaded in the CLI);
    reading them is the rank's, which ends a planted one in one line."""
    marker = tmp_path / "ran"
    d = _cifar_dir(tmp_path, pickle.dumps(_Planted(os.system, f"touch {marker}"), protocol=2))
    r = subprocess.run([sys.executable, "-m", "workloads.train", "--dataset", "cifar10", "--data-dir", str(tmp_path),
                        "--max-iters", "1"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={**os.environ, "RANK": "3"})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    first = r.stderr.splitlines()[0]
    assert first.startswith(f"error (rank 3): cannot read {d / 'data_batch_1'} as a CIFAR batch: it names "
                            "posix.system"), r.stderr
    assert not marker.exists()


# ---------------------------------------------------------------- checkpoints
def _model():
    return build_model("cnn", 10, 3, 0.25, None)


def test_a_checkpoint_records_its_sha256_and_a_code_running_one_is_one_line(tmp_path):
    ck = tmp_path / "ck.pt"
    checkpoint.save(ck, _model(), model_name="cnn", width=0.25, depth=None, num_classes=10, dataset="digits",
                    accuracy=0.5)
    assert stat.S_IMODE(os.stat(ck).st_mode) == 0o600
    meta: dict = {}
    notes = checkpoint.load_into(_model(), ck, "cnn", meta)
    assert meta["sha256"] == hashlib.sha256(ck.read_bytes()).hexdigest() and meta["sha256"][:16] in notes[0]
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.pt"
    torch.save({"format": 1, "model": "cnn", "state_dict": {}, "x": _Planted(os.system, f"touch {marker}")}, evil)
    raw = tmp_path / "raw.pt"
    raw.write_bytes(pickle.dumps(_Planted(exec, f"open({str(marker)!r}, 'w')")))
    for path, words in ((evil, "posix.system"), (raw, "Unsupported")):
        with pytest.raises(checkpoint.CheckpointError) as e:
            checkpoint.load_into(_model(), path, "cnn")
        msg = str(e.value)
        assert msg.startswith(f"--init {path}: not loaded: it holds what a weights-only load refuses"), msg
        assert words in msg and "\n" not in msg and "weights_only` set to `False" not in msg, msg
    odd = tmp_path / "odd.pt"
    torch.save({"format": 1, "model": "cnn", "state_dict": {"w": [1, 2]}}, odd)
    with pytest.raises(checkpoint.CheckpointError, match="not a workloads checkpoint"):
        checkpoint.load_into(_model(), odd, "cnn")
    assert not marker.exists()


def test_a_rank_says_one_line_for_a_planted_checkpoint(tmp_path):
    """The CLI checks that --init is a regular file that begins as a checkpoint; loading it
    is the rank's, which ends a planted one in one line."""
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.pt"
    torch.save({"format": 1, "x": _Planted(os.system, f"touch {marker}")}, evil)
    r = subprocess.run([sys.executable, "-m", "workloads.train", "--init", str(evil), "--max-iters", "1",
                        "--batch-size", "8"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert not marker.exists(), "loading the checkpoint ran its code"  # first: what an unrestricted torch.load did
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"error (rank 0): --init {evil}: not loaded: it holds what a weights-only load refuses (Trying to " \
           "load unsupported GLOBAL posix.system" in r.stderr, r.stderr


def test_saving_a_checkpoint_never_writes_through_planted_links(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = tmp_path / "shared"
    out.mkdir()
    ck = out / "ck.pt"
    (out / "ck.pt.tmp").symlink_to(victim)  # the old, predictable temporary name
    ck.symlink_to(victim)
    checkpoint.save(ck, _model(), model_name="cnn", width=0.25, depth=None, num_classes=10, dataset="digits",
                    accuracy=None)
    assert victim.read_bytes() == b"precious", "the checkpoint was written through the planted link"
    assert not ck.is_symlink() and ck.is_file() and checkpoint.load_into(_model(), ck, "cnn")
    assert sorted(p.name for p in out.iterdir()) == ["ck.pt", "ck.pt.tmp"]  # no temporary file left


OTHER = "tbuntrusted1"  # a second real user; not the kernel tests' (they remove theirs when done)


@pytest.fixture
def other_user():
    """(name, uid) of a second real user made by useradd (removed after, when made here), and
    a folder as /tmp is (sticky, everyone may write; pytest's tmp_path is root's own, 0700)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make a second user (useradd)")
    if shutil.which("runuser") is None or shutil.which("useradd") is None:
        pytest.skip("runuser/useradd missing: cannot act as another user here")
    try:
        pwd.getpwnam(OTHER)
        made = False
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", OTHER], check=True)
        made = True
    place = Path(tempfile.mkdtemp(prefix="tb-untrusted-", dir="/tmp"))
    place.chmod(0o1777)
    try:
        yield OTHER, pwd.getpwnam(OTHER).pw_uid, place
    finally:
        shutil.rmtree(place, ignore_errors=True)
        if made:
            subprocess.run(["pkill", "-9", "-u", OTHER], capture_output=True)
            subprocess.run(["userdel", OTHER], capture_output=True)


def _as(user: str, *argv: str) -> None:
    subprocess.run(["runuser", "-u", user, "--", *argv], check=True, capture_output=True, cwd="/")


@pytest.mark.slow  # the quick pass under 2 minutes; the suite runs it
def test_pretraining_refuses_a_directory_another_user_owns_and_others_may_write(other_user):
    user, uid, place = other_user
    shared = place / "tmp"
    _as(user, "mkdir", "-m", "1777", str(shared))  # the other user's, everyone may write: as /tmp, but not ours
    p = subprocess.run([sys.executable, "-m", "workloads.pretrain", "--out", str(shared / "ck.pt"), "--epochs",
                        "0.05", "--width", "0.25"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip() == (f"error: will not write the checkpoint {shared / 'ck.pt'}: {shared} belongs to "
                                f"uid {uid} and everyone may write to it: another user could replace the file "
                                "there; write it in a directory of your own (e.g. ~/ckpt/)"), p.stderr
    assert list(shared.iterdir()) == []
    _as(user, "chmod", "0755", str(shared))  # another user's, but only they may write: where root writes for them
    checkpoint.save(shared / "ck.pt", _model(), model_name="cnn", width=0.25, depth=None, num_classes=10,
                    dataset="digits", accuracy=None)


# ---------------------------------------------------------------- hooks
class _DDP:
    def __init__(self, refuse=None):
        self.refuse, self.got = refuse, None

    def register_comm_hook(self, state, hook_):
        if self.refuse:
            raise self.refuse
        self.got = (state, hook_)


@pytest.mark.parametrize("spec,words", [
    ("os.path:join", "--hook os.path:join: calling it with the process group raised TypeError: "),
    ("json:dumps", "--hook json:dumps: calling it with the process group raised TypeError: Object of type"),
    ("builtins:tuple", "--hook builtins:tuple: calling it with the process group raised TypeError"),
    ("builtins:str", "--hook builtins:str: the factory must return (state, hook), got str"),
    ("os.path:sep", "--hook os.path:sep: sep is not callable"),
    ("os", "--hook os: name a factory, package.module:function"),
    ("os.path:nosuch", "--hook os.path:nosuch: AttributeError: module 'posixpath' has no attribute 'nosuch'"),
])
def test_a_hook_spec_that_names_no_factory_is_one_line(spec, words):
    with pytest.raises(ValueError) as e:
        hook._register(_DDP(), spec, hook.load(spec, ""), object())
    assert str(e.value).startswith(words) and "\n" not in str(e.value), str(e.value)


def test_a_hook_module_that_fails_or_a_hook_ddp_refuses_is_one_line(tmp_path):
    (tmp_path / "broken_hooks.py").write_text("raise RuntimeError('half\\nwritten')\n")
    with pytest.raises(ValueError, match=r"^--hook broken_hooks:f: RuntimeError: half written$"):
        hook.load("broken_hooks:f", str(tmp_path))
    sys.path.remove(str(tmp_path))
    with pytest.raises(ValueError, match=r"--hook m:f: DDP refused its hook: ValueError: two arguments"):
        hook._register(_DDP(ValueError("two arguments")), "m:f", lambda pg: (None, print), object())


def test_a_rank_ends_a_hook_that_is_no_factory_in_one_line(tmp_path):
    r = train(1, tmp_path / "run", "--scheme", "hook", "--hook", "os.path:join", "--max-iters", "1")
    assert r.returncodes == [2] and "Traceback" not in r.logs[0], r.logs
    assert "error (rank 0): --hook os.path:join: calling it with the process group raised TypeError" in r.logs[0]
