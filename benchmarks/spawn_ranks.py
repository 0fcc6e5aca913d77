"""Runs a function on ranks of a local Gloo job (one spawned process each) and
returns what rank `reporter` puts on the queue: shared by the benchmarks that
run torch.distributed.pipelining beside Conveyor."""
import socket

import torch.multiprocessing as mp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(target, world, *args, timeout=900):
    """Calls target(rank, port, *args, queue) on `world` spawned processes; returns the first item queued."""
    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=target, args=(r, port, *args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    result = queue.get(timeout=timeout)
    for p in procs:
        p.join(timeout=120)
        if p.exitcode != 0:
            raise RuntimeError(f"a torch.distributed.pipelining rank exited with {p.exitcode}")
    return result
