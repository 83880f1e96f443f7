"""Chapter 9 — training (训练): label smoothing (标签平滑), the loss computation, Adam with the
warm-up schedule, and ``run_epoch`` with gradient accumulation (梯度累积).

``Batch`` (chapter 4) and ``rate`` (the schedule) are re-exported from here.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LambdaLR

from .masks import Batch
from .schedule import rate

__all__ = [
    "Batch", "LabelSmoothing", "SimpleLossCompute", "TrainState", "accumulated_step", "accumulation_groups",
    "autocast", "data_parallel", "distributed_context", "make_optimizer", "rank_device", "rate", "run_epoch",
    "select_device", "train_with_accumulation",
]


class LabelSmoothing(nn.Module):
    """KL divergence to a smoothed target distribution, summed over tokens.

    The true class gets ``1 - smoothing``; the remaining mass is spread over ``size - 2``
    classes (not the true class, not padding); the padding column is 0; rows whose label is
    padding are all 0 and add nothing. The sum runs only where the target is positive, so a
    ``-inf`` log-probability under a zero target never makes ``0 * -inf = NaN``.

    Shapes: x ``(n, size)`` log-probabilities, target ``(n,)`` ids  ->  scalar.
    """

    def __init__(self, size: int, padding_idx: int, smoothing: float = 0.0) -> None:
        super().__init__()
        if size < 3:
            raise ValueError(f"size must be >= 3 (a true class, padding and one more), got {size}")
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
        self.padding_idx = padding_idx
        self.confidence = 1.0 - smoothing
        self.smoothing = smoothing
        self.size = size
        self.true_dist: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.size(1) != self.size or target.shape != x.shape[:1]:
            raise ValueError(f"expected x (n, {self.size}) and target (n,), "
                             f"got {tuple(x.shape)}, {tuple(target.shape)}")
        true_dist = torch.full_like(x, self.smoothing / (self.size - 2), dtype=torch.float32)
        true_dist.scatter_(1, target.unsqueeze(1), self.confidence)
        true_dist[:, self.padding_idx] = 0
        true_dist[target == self.padding_idx] = 0
        self.true_dist = true_dist
        positive = true_dist > 0
        log_q = x.float().masked_fill(~positive, 0.0)
        return (torch.xlogy(true_dist, true_dist) - true_dist * log_q).sum()


class SimpleLossCompute:
    """Generator + criterion; ``(x, y, norm) -> (loss summed over tokens, loss per token to backprop)``.

    Shapes: x ``(batch, len, d_model)`` decoder states, y ``(batch, len)`` labels.
    """

    def __init__(self, generator: nn.Module, criterion: nn.Module) -> None:
        self.generator = generator
        self.criterion = criterion

    def __call__(
        self, x: torch.Tensor, y: torch.Tensor, norm: torch.Tensor | float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.generator(x)
        sloss = self.criterion(x.reshape(-1, x.size(-1)), y.reshape(-1)) / norm
        return sloss.detach() * norm, sloss


@dataclass
class TrainState:
    """Counters across epochs (a fresh one per run: never a shared default instance)."""

    step: int = 0  # micro-batches seen
    accum_step: int = 0  # optimizer steps taken
    samples: int = 0
    tokens: int = 0


def select_device(name: str = "auto") -> torch.device:
    """``auto`` picks cuda, then mps, then cpu; any other name is used as given."""
    if name != "auto":
        return torch.device(name)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def rank_device(name: str = "auto") -> torch.device:
    """The device of this process. Outside ``torchrun`` (or with one process) ``select_device(name)``.

    Under ``torchrun`` on CUDA each rank takes ``cuda:$LOCAL_RANK`` and makes it the current
    device (before the process group starts, as NCCL needs); ``--device cuda`` or ``auto`` means
    exactly that, while a device that names another GPU contradicts the rank and is refused.
    CPU ranks stay on the CPU (gloo); MPS has no multi-process backend.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1 or "LOCAL_RANK" not in os.environ:
        return select_device(name)
    local = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda" if name == "auto" and torch.cuda.is_available() else
                          "cpu" if name == "auto" else name)
    if device.type == "mps":
        raise ValueError("training with several processes needs CUDA (nccl) or the CPU (gloo), not mps")
    if device.type != "cuda":
        return device
    if device.index is not None and device.index != local:
        raise ValueError(f"--device {name} contradicts LOCAL_RANK={local}: under torchrun each process uses "
                         f"cuda:$LOCAL_RANK; pass --device cuda (or auto) and choose GPUs with CUDA_VISIBLE_DEVICES")
    if local >= torch.cuda.device_count():
        raise ValueError(f"LOCAL_RANK={local} but only {torch.cuda.device_count()} CUDA device(s) are visible")
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    return device


def data_parallel(model: nn.Module, device: torch.device) -> nn.Module:
    """``model`` wrapped for DDP when a process group is up (one GPU per process: ``device_ids``
    names this rank's GPU; none on the CPU), else ``model`` itself."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return model
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA (the matmuls run in bf16, the loss stays float32); a no-op elsewhere."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def make_optimizer(model: nn.Module, d_model: int, factor: float = 1.0, warmup: int = 4000
                   ) -> tuple[torch.optim.Adam, LambdaLR]:
    """The paper's Adam (betas 0.9/0.98, eps 1e-9) with base lr 1 scaled by ``rate`` each step."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    scheduler = LambdaLR(optimizer, lr_lambda=lambda step: rate(step, d_model, factor, warmup))
    return optimizer, scheduler


def accumulation_groups(batches: Iterable[Batch], accum_iter: int) -> Iterator[list[Batch]]:
    """Consecutive groups of ``accum_iter`` micro-batches; the last group may be shorter."""
    if accum_iter < 1:
        raise ValueError(f"accum_iter must be >= 1, got {accum_iter}")
    group: list[Batch] = []
    for batch in batches:
        group.append(batch)
        if len(group) == accum_iter:
            yield group
            group = []
    if group:
        yield group


def _global_tokens(ntokens: int, device: torch.device) -> int:
    """Target tokens of this optimizer step summed over every DDP rank (just ``ntokens`` alone)."""
    if not (dist.is_available() and dist.is_initialized()):
        return ntokens
    total = torch.tensor([ntokens], dtype=torch.float64, device=device)
    dist.all_reduce(total)
    return int(total.item())


def accumulated_step(
    model: nn.Module,
    group: Sequence[Batch],
    loss_compute: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | float], tuple[torch.Tensor, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    scheduler: LambdaLR,
    device: torch.device | None = None,
) -> tuple[float, int]:
    """One optimizer step over the micro-batches of ``group``; returns (summed token loss, tokens).

    Each micro-batch's summed token loss is divided by the *group's* total of target tokens
    (over every rank under DDP, whose gradient average is undone by the world size), so the
    accumulated gradient equals that of one merged batch: every token weighs the same, however
    the tokens are split into micro-batches. Then the optimizer steps, the gradients are cleared
    and the scheduler steps, once.
    """
    device = device or next(model.parameters()).device
    # The notes' Batch has no `to` (a student's, in chapter 12): it is used where it is.
    group = [batch.to(device) if hasattr(batch, "to") else batch for batch in group]
    tokens = sum(int(batch.ntokens) for batch in group)
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    norm = max(_global_tokens(tokens, device), 1) / world
    loss_sum = 0.0
    for i, batch in enumerate(group):
        # DDP: synchronise gradients once, on the group's last backward
        sync = contextlib.nullcontext() if i == len(group) - 1 or not hasattr(model, "no_sync") else model.no_sync()
        with sync:
            with autocast(device):
                out = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
                loss, loss_node = loss_compute(out, batch.tgt_y, norm)
            loss_node.backward()
        loss_sum += float(loss)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    scheduler.step()
    return loss_sum, tokens


def train_with_accumulation(
    model: nn.Module,
    batches: Iterable[Batch],
    loss_compute: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | float], tuple[torch.Tensor, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    scheduler: LambdaLR,
    accum_iter: int,
) -> int:
    """Train on ``batches`` with one optimizer step per ``accum_iter`` micro-batches (and one for
    a final shorter group); returns the number of optimizer steps.

    Each step's gradient is the merged batch's: the group's token losses summed and divided by
    the group's total target tokens (``accumulated_step``).
    """
    model.train()
    steps = 0
    for group in accumulation_groups(batches, accum_iter):
        accumulated_step(model, group, loss_compute, optimizer, scheduler)
        steps += 1
    return steps


def run_epoch(
    data_iter: Iterable[Batch],
    model: nn.Module,
    loss_compute: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | float], tuple[torch.Tensor, torch.Tensor]],
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: LambdaLR | None = None,
    mode: str = "train",
    accum_iter: int = 1,
    train_state: TrainState | None = None,
    device: torch.device | None = None,
    on_step: Callable[[TrainState, float], bool] | None = None,
) -> tuple[float, TrainState]:
    """One pass over ``data_iter``; returns (loss per target token, the updated state).

    ``mode="train"``: one optimizer step (and one scheduler step) per group of ``accum_iter``
    micro-batches, the last group possibly shorter, each with the gradient of the merged group
    (``accumulated_step``). ``mode="eval"``: no gradients. ``on_step(state, loss per token)``
    runs after each optimizer step and may return True to stop early.
    """
    if mode not in ("train", "eval"):
        raise ValueError(f"mode must be 'train' or 'eval', got {mode!r}")
    state = train_state if train_state is not None else TrainState()
    device = device or next(model.parameters()).device
    total_loss, total_tokens = 0.0, 0
    if mode == "eval":
        with torch.no_grad():
            for batch in data_iter:
                batch = batch.to(device)
                with autocast(device):
                    out = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
                    loss, _ = loss_compute(out, batch.tgt_y, batch.ntokens)
                total_loss += float(loss)
                total_tokens += int(batch.ntokens)
        return total_loss / max(total_tokens, 1), state
    for group in accumulation_groups(data_iter, accum_iter):
        loss, tokens = accumulated_step(model, group, loss_compute, optimizer, scheduler, device)
        total_loss += loss
        total_tokens += tokens
        state.step += len(group)
        state.accum_step += 1
        state.samples += sum(batch.src.size(0) for batch in group)
        state.tokens += tokens
        if on_step and on_step(state, loss / max(tokens, 1)):
            break
    return total_loss / max(total_tokens, 1), state


@contextlib.contextmanager
def distributed_context(backend: str | None = None):
    """Join the process group when launched by ``torchrun`` (``WORLD_SIZE`` > 1); yields (rank, world size).

    gloo on CPU, nccl on CUDA. Outside ``torchrun`` it yields ``(0, 1)`` and does nothing.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1 or dist.is_initialized():
        yield (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        return
    dist.init_process_group(backend or ("nccl" if torch.cuda.is_available() else "gloo"))
    try:
        yield dist.get_rank(), dist.get_world_size()
    finally:
        dist.destroy_process_group()

