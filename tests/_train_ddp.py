"""Train a tiny model on fixed copy-task batches and write the loss of every step as JSON.

Run once under ``torchrun --nproc_per_node 2`` (each process takes half of every batch; DDP
averages the gradients) and once as a single process with the whole batch: the loss curves
must agree. Usage: ``python _train_ddp.py OUT.json``.
"""

import json
import sys

import torch
from torch.nn.parallel import DistributedDataParallel

from tfm_solution import make_model
from tfm_solution.data import PAD, collate, copy_examples
from tfm_solution.training import LabelSmoothing, SimpleLossCompute, distributed_context, make_optimizer, run_epoch

STEPS, GLOBAL_BATCH = 8, 8

with distributed_context("gloo") as (rank, world):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = make_model(11, 11, N=1, d_model=16, d_ff=32, h=2, dropout=0.0)
    opt, sched = make_optimizer(model, 16, factor=1.0, warmup=4)
    examples = copy_examples(STEPS * GLOBAL_BATCH, 6, 11, torch.Generator().manual_seed(1))
    share = GLOBAL_BATCH // world
    batches = [collate(examples, range(s * GLOBAL_BATCH + rank * share, s * GLOBAL_BATCH + (rank + 1) * share))
               for s in range(STEPS)]
    wrapped = DistributedDataParallel(model) if world > 1 else model
    losses = []
    loss_compute = SimpleLossCompute(model.generator, LabelSmoothing(11, PAD, 0.1))
    run_epoch(batches, wrapped, loss_compute, opt, sched, on_step=lambda st, loss: losses.append(loss) and False)
    if world > 1:  # the global loss of a step is the mean over processes (equal token counts)
        gathered = [None] * world
        torch.distributed.all_gather_object(gathered, losses)
        losses = [sum(col) / world for col in zip(*gathered)]
    if rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump({"world": world, "losses": losses}, f)
