"""conveyor.Pipeline across processes under torchrun, against the installed
package: two processes (a 2-worker pipeline) and four (2 replicas of it)
train as one process does, to float64 rounding."""
import os
import pathlib
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import conveyor

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import torchrun_worker as worker  # noqa: E402

TOLERANCE = 1e-10


def torchrun(tmp_path, nproc: int, schedule: str, mode: str = "sgd"):
    """Runs torchrun_worker.py on nproc processes; returns what each rank saved."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               str(pathlib.Path(worker.__file__)), str(tmp_path), schedule, "2", mode]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(nproc)]


def eager_reference():
    """The unsplit model, whole batches: first-step gradients, losses, final weights."""
    model = worker.make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    grads, losses = {}, []
    for step in range(worker.STEPS):
        inputs, target = worker.batch(step)
        # Four micro-batches of a mean loss: the pipeline's gradient is their mean.
        loss = sum(worker.loss_fn(model(*[t.chunk(4)[i] for t in inputs]), target.chunk(4)[i]) for i in range(4)) / 4
        loss.backward()
        losses.append(loss.item())
        if step == 0:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
    return grads, losses, dict(model.state_dict()), model(*worker.batch(0)[0]).detach()


def assert_close(got, want, what):
    assert got.shape == want.shape, what
    assert (got - want).abs().max().item() <= TOLERANCE, f"{what}: differs by {(got - want).abs().max().item()}"


def check_ranks(ranks, workers, replicas):
    grads, losses, state, output = eager_reference()
    seen = set()
    for r, saved in enumerate(ranks):
        assert (saved["worker"], saved["replica"], saved["replicas"]) == (r % workers, r // workers, replicas)
        assert saved["losses"] == pytest.approx(losses, abs=TOLERANCE)  # the global batch's, on every rank
        assert saved["grads"], f"rank {r} holds no parameters"
        for name, g in saved["grads"].items():
            assert_close(g, grads[name], f"rank {r}: gradient of {name}")
        for name, t in saved["state"].items():
            assert_close(t, state[name], f"rank {r}: trained {name}")
            seen.add(name)
        last_stage = r % workers == workers - 1
        assert (saved["output"] is not None) == last_stage
        if last_stage:
            assert_close(saved["output"], output, f"rank {r}: forward")
    assert seen == set(state), "every weight lives on some rank"
    initial = worker.make_model().state_dict()
    assert all(not torch.equal(initial[n], state[n]) for n in state), "training moved every weight"


def test_two_processes_train_as_one(tmp_path):
    ranks = torchrun(tmp_path, 2, "1f1b")
    check_ranks(ranks, workers=2, replicas=1)
    # Through shared memory by default: a ring each way between the two.
    assert [saved["shared_memory_links"] for saved in ranks] == [2, 2]
    # And as the in-process pipeline does, its parameters split between the ranks.
    pipe = conveyor.Pipeline(worker.make_model(), split_points=worker.SPLIT_POINTS, microbatches=4,
                             schedule="1f1b", loss_fn=worker.loss_fn)
    grads, losses = worker.train(pipe)
    assert ranks[0]["losses"] == pytest.approx(losses, abs=TOLERANCE)
    names = [set(saved["grads"]) for saved in ranks]
    assert names[0].isdisjoint(names[1]) and names[0] | names[1] == set(grads)


def test_two_processes_train_an_exported_program_as_one(tmp_path):
    """The model as a torch.export program: C++ runs its graph on each rank."""
    check_ranks(torchrun(tmp_path, 2, "gpipe", mode="exported"), workers=2, replicas=1)


def test_two_processes_over_gloo_train_as_one(tmp_path):
    """shared_memory=False: every message over Gloo's sockets, as between machines."""
    ranks = torchrun(tmp_path, 2, "1f1b", mode="gloo")
    check_ranks(ranks, workers=2, replicas=1)
    assert [saved["shared_memory_links"] for saved in ranks] == [0, 0]


def test_two_replicas_of_a_two_process_pipeline(tmp_path):
    check_ranks(torchrun(tmp_path, 4, "gpipe"), workers=2, replicas=2)


def test_optimizer_state_gradients_and_parameters_sharded_across_replicas_train_as_unsharded(tmp_path):
    """shard="optimizer", "gradients" and "parameters": 2 replicas of a
    2-process pipeline, Adam: the reduce-scatter sums the same two numbers
    the all-reduce does and Adam's update is elementwise, so the weights are
    bit-identical. At "parameters" the schedule gathers each stage's weights
    (UNSHARD), and a state dict needs them gathered first."""
    for rank, saved in enumerate(torchrun(tmp_path, 4, "1f1b", mode="sharded")):
        assert "needs a synchronous schedule; 'pipedream'" in saved["refusal"], saved["refusal"]
        reductions = [a for line in saved["schedule"].splitlines()[1:] for a in line.split() if "REDUCE_GRAD" in a]
        assert reductions == ["0REDUCE_GRAD", "1REDUCE_GRAD"], saved["schedule"]
        gathers = [a for line in saved["schedule"].splitlines()[1:] for a in line.split() if "SHARD" in a]
        assert gathers == ["0UNSHARD", "0RESHARD", "1UNSHARD", "1RESHARD"], saved["schedule"]
        for shard in ("optimizer", "gradients", "parameters"):
            assert saved["none"].keys() == saved[shard].keys() and saved["none"], rank
            for name, want in saved["none"].items():
                assert torch.equal(saved[shard][name], want), f"rank {rank}, {shard}: {name}"
        for name, want in saved["none"].items():
            assert not torch.equal(want, worker.make_model().state_dict()[name]), f"rank {rank}: {name} untrained"


@pytest.fixture
def one_process_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_groups_that_do_not_fit_are_refused(one_process_group):
    model = worker.make_model()
    with pytest.raises(ValueError, match="workers=2, but the process_group holds 1 processes"):
        conveyor.Pipeline(model, workers=2, process_group=one_process_group, loss_fn=worker.loss_fn)
    with pytest.raises(ValueError, match="1 split points make 2 stages, but the options ask for 1"):
        conveyor.Pipeline(model, split_points=worker.SPLIT_POINTS, process_group=one_process_group,
                          loss_fn=worker.loss_fn)
    with pytest.raises(TypeError, match="process_group must be a torch.distributed.ProcessGroup"):
        conveyor.Pipeline(model, process_group="world", loss_fn=worker.loss_fn)
    with pytest.raises(ValueError, match="replica_group must be given with a process_group"):
        conveyor.Pipeline(model, replica_group=one_process_group, loss_fn=worker.loss_fn)
    with pytest.raises(ValueError, match="cannot hold replicas of a 2-worker pipeline"):
        conveyor.process_groups(2)


def test_process_groups_needs_init():
    if dist.is_initialized():
        pytest.skip("a process group is live")
    with pytest.raises(RuntimeError, match="init_process_group first"):
        conveyor.process_groups(2)
