"""
Tests of train.py on two torchrun "nodes" on one machine: two launchers of one process each,
as on two machines, so that the second node's process has LOCAL_RANK 0 and RANK 1. The nodes
share one out_dir, which shows that rank 0 alone writes there; then each has its own, as two
machines without a shared disk have.
Run: python -m pytest -q tests/test_multinode.py (or -k ddp, with the other DDP tests)
"""

import os
import signal
import socket
import sys

import pytest

import train
from conftest import ENV, argv_for, config_for, read_log, start, trained_to, wait_for
from train import TRAINING_KEYS, load_checkpoint

# what rank 0 leaves in out_dir (its train.lock goes with the run); a process that took itself for
# rank 0 would add a second log's records, or fail on the lock
RANK_0_FILES = {"log.jsonl", "ckpt.pt", "best.pt"}
ACKNOWLEDGED = "SIGTERM: stopping after the step under way"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_two_nodes(argv):
    """A torchrun launcher per node, one process each, meeting at node 0's address and port."""
    port = free_port()
    launchers = []
    for node_rank in (0, 1):
        torchrun = (sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
                    "--nproc_per_node=1", f"--node_rank={node_rank}", "--master_addr=127.0.0.1",
                    f"--master_port={port}", "train.py")
        launchers.append(start(argv, launcher=torchrun, env=ENV))
    return launchers


def finish(processes, timeout=120):
    """(return code, stdout, stderr) of each process; one left running is killed."""
    try:
        outputs = [p.communicate(timeout=timeout) for p in processes]
        return [(p.returncode, *output) for p, output in zip(processes, outputs)]
    finally:
        for p in processes:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def assert_finished(code, err):
    if code != 0:  # gloo's threads now and then abort a process after train() returned
        assert "Signal 6 (SIGABRT)" in err and 'train.py", line' not in err, err[-3000:]


def lines_from(stream, start):
    return [line for line in stream.splitlines() if line.startswith(start)]


def test_two_node_ddp_run_stops_resumes_and_only_rank_0_writes(data_dir, tmp_path):
    out_dir = tmp_path / "run"
    argv = argv_for(data_dir, out_dir, max_iters=1000, eval_interval=1000)
    launchers = start_two_nodes(argv)
    try:
        wait_for(trained_to(out_dir, 5), launchers[0])
    finally:  # a scheduler stops a job on every node
        for p in launchers:
            p.send_signal(signal.SIGTERM)
        (_, out0, err0), (_, out1, err1) = finish(launchers)
    stopped_at = load_checkpoint(str(out_dir / "ckpt.pt"), TRAINING_KEYS)["iter_num"]
    assert 5 <= stopped_at < 1000, err0[-3000:]
    # rank 0 alone speaks: once when the signal comes, once when the state is saved
    assert len(lines_from(err0, ACKNOWLEDGED)) == 1, err0[-3000:]
    assert lines_from(err0, "stopped by SIGTERM") == [
        f"stopped by SIGTERM after iteration {stopped_at}: {out_dir}/ckpt.pt holds iteration "
        f"{stopped_at}; continue with the same command and --init_from=resume"]
    assert len(lines_from(out0, "baseline: ")) == 1 and f"iter {stopped_at}: " in out0
    assert not lines_from(out1, "baseline: ") and not lines_from(out1, "iter ")
    assert not lines_from(err1, ACKNOWLEDGED)
    assert not lines_from(err1, "stopped by")

    launchers = start_two_nodes([*argv, f"--max_iters={stopped_at + 3}", "--init_from=resume"])
    (code0, out0, err0), (code1, out1, err1) = finish(launchers)
    assert_finished(code0, err0)
    assert_finished(code1, err1)
    assert f"resumed from iteration {stopped_at} of {stopped_at + 3}" in out0
    assert not lines_from(out1, "resumed") and not lines_from(out1, "iter ")

    # out_dir holds what rank 0 writes, and each record once
    assert {path.name for path in out_dir.iterdir()} == RANK_0_FILES
    records = read_log(out_dir)
    starts = [r for r in records if r["type"] == "start"]
    assert [(r["init_from"], r["iter_num"], r["world_size"]) for r in starts] == [
        ("scratch", 0, 2), ("resume", stopped_at, 2)]
    trains = [r["iter"] for r in records if r["type"] == "train"]
    assert trains == list(range(1, stopped_at + 4))  # every step once, none lost, none twice
    assert [r["iter"] for r in records if r["type"] == "eval"] == [0, stopped_at + 3]
    checkpoint = load_checkpoint(str(out_dir / "ckpt.pt"), TRAINING_KEYS)
    assert checkpoint["iter_num"] == stopped_at + 3 and len(checkpoint["rng"]) == 2


@pytest.mark.usefixtures("one_thread")  # conftest.py
def test_two_node_ddp_resume_with_out_dir_on_the_first_node_alone(data_dir, tmp_path):
    # two machines, each with a disk of its own: node 1's out_dir is another folder here, which
    # rank 0 never writes to and rank 1 must not need
    node_0_dir, node_1_dir = tmp_path / "node0", tmp_path / "node1"
    # a run of one process to resume on two: the second rank keeps its seed
    train.train(config_for(data_dir, node_0_dir, max_iters=2, eval_interval=2))
    resume = dict(max_iters=4, eval_interval=2, init_from="resume")
    # the two processes as torchrun starts them, without its launchers
    port = free_port()
    processes = [start(argv_for(data_dir, out_dir, **resume), env=dict(
        ENV, RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE="2", LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
        for rank, out_dir in enumerate((node_0_dir, node_1_dir))]
    (code0, out0, err0), (code1, out1, err1) = finish(processes)
    assert_finished(code0, err0)
    assert_finished(code1, err1)
    assert "resumed from iteration 2 of 4" in out0
    assert load_checkpoint(str(node_0_dir / "ckpt.pt"), TRAINING_KEYS)["iter_num"] == 4
    assert not node_1_dir.exists()
