"""Runs a function on ranks of a local Gloo job (one spawned process each) and
returns what rank `reporter` puts on the queue: shared by the benchmarks that
run torch.distributed.pipelining beside Conveyor."""
import queue as queue_module
import socket
import time

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
    deadline = time.monotonic() + timeout
    while True:  # a rank that dies before it reports must not leave us waiting
        try:
            result = queue.get(timeout=1)
            break
        except queue_module.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                raise RuntimeError(f"torch.distributed.pipelining ranks exited with {dead} before reporting"
                                   if dead else f"no result from the ranks within {timeout} s")
    for p in procs:
        p.join(timeout=120)
        if p.exitcode != 0:
            raise RuntimeError(f"a torch.distributed.pipelining rank exited with {p.exitcode}")
    return result
