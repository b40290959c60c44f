"""Optimizer construction and the learning-rate schedule (a pure function of the iteration)."""

import math

import torch
import torch.nn as nn

CLASS_BRANCHES = ("head.cls.", "head.one2one_cls.")  # what MuSGD trains at CLASS_LR_SCALE times the rate
CLASS_LR_SCALE = 3.0


def build_optimizer(model, name, lr, momentum, weight_decay):
    """Three parameter groups: conv/linear weights (with weight decay), BatchNorm weights and all
    biases (without: decaying a BN scale or a bias towards zero only hurts). Frozen parameters
    (requires_grad=False) are left out: with weight decay on, a zero gradient still moves a
    parameter (pitfall T4). musgd, as Ultralytics builds it: the class branches' parameters in three more groups
    (first) whose rate is CLASS_LR_SCALE times the others' (their `lr_scale`, which set_learning_rate applies)."""
    split = name == "musgd"
    found = {}  # (kind, lr_scale): parameters
    for module_name, module in model.named_modules():
        scale = CLASS_LR_SCALE if split and f"{module_name}.".startswith(CLASS_BRANCHES) else 1.0
        for pname, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            if pname == "bias":
                kind = "bias"
            elif isinstance(module, (nn.BatchNorm2d, nn.SyncBatchNorm, nn.GroupNorm, nn.LayerNorm)):
                kind = "no_decay"
            else:
                kind = "decay"
            found.setdefault((kind, scale), []).append(p)
    # Groups carry their name: the warmup and a resume find them by it, not by position. The plain decay group comes
    # last: train.py logs its rate.
    groups = [
        {
            "name": kind + "_cls" * (scale != 1.0),
            "params": found.get((kind, scale), []),
            "weight_decay": weight_decay if kind == "decay" else 0.0,
            "lr_scale": scale,
        }
        for scale in ([CLASS_LR_SCALE, 1.0] if split else [1.0])
        for kind in ("bias", "no_decay", "decay")
    ]
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=True)
    if name == "musgd":  # conv weights (the decay groups) get Muon's update as well as SGD's
        for group in groups:
            group["use_muon"] = group["name"].startswith("decay")
        return MuSGD(groups, lr=lr, momentum=momentum, nesterov=True)
    if name == "adamw":
        # Optimizer state stays fp32 under AMP (torch keeps it in the parameters' dtype, and the
        # parameters stay fp32): eps=1e-8 would underflow in fp16 (pitfall T3).
        return torch.optim.AdamW(groups, lr=lr, betas=(momentum, 0.999))
    raise ValueError(f"optimizer must be sgd, adamw or musgd, got {name!r}")


def newton_schulz_orthogonalise(matrix, steps=5):
    """The nearest semi-orthogonal matrix to `matrix` (U V^T of its SVD), roughly: five iterations of the quintic
    Newton-Schulz map with Muon's coefficients, in bf16 (the iteration tolerates it; singular values land near 1,
    not on it, which Muon's updates do not mind)."""
    x = matrix.bfloat16()
    x = x / (x.norm() + 1e-7)  # singular values <= 1, where the iteration converges
    tall = x.shape[0] > x.shape[1]
    if tall:  # the Gram matrix of the short side is the cheaper one
        x = x.T
    for _ in range(steps):
        gram = x @ x.T
        x = 3.4445 * x + (-4.7750 * gram + 2.0315 * gram @ gram) @ x
    return (x.T if tall else x).to(matrix.dtype)


class MuSGD(torch.optim.Optimizer):
    """MuSGD (YOLO26's optimizer, as Ultralytics builds it): SGD with momentum on every parameter, and on the groups
    marked use_muon (conv weights) also Muon's step: the momentum of the gradient, flattened to (out, in * k * k),
    orthogonalised (newton_schulz_orthogonalise), scaled by sqrt(max(1, rows / columns)) of the parameter, at `muon`
    times the learning rate; their SGD step is then at `sgd` times it. Orthogonalising equalises the update's
    directions, so rarely used ones are not drowned by dominant ones. Weight decay acts through the SGD step only.
    Its state (two momentum buffers per Muon parameter) is in state_dict(): last.pt keeps it, a resume is exact."""

    def __init__(self, params, lr=0.01, momentum=0.9, weight_decay=0.0, nesterov=True, muon=0.2, sgd=1.0):
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov, use_muon=False)
        super().__init__(params, defaults)
        self.muon, self.sgd = muon, sgd

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, beta, nesterov = group["lr"], group["momentum"], group["nesterov"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state, grad = self.state[p], p.grad
                if not state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                    if group["use_muon"]:
                        state["muon_buffer"] = torch.zeros_like(p)
                sgd_lr = lr
                if group["use_muon"]:
                    buffer = state["muon_buffer"].lerp_(grad, 1 - beta)  # an average, not a sum: scale-free
                    update = grad.lerp(buffer, beta) if nesterov else buffer
                    flat = update.reshape(len(update), -1)
                    # Ultralytics scales by the parameter's last two sides (1 for a square conv kernel)
                    orthogonal = newton_schulz_orthogonalise(flat) * max(1, p.shape[-2] / p.shape[-1]) ** 0.5
                    p.add_(orthogonal.view_as(p), alpha=-lr * self.muon)
                    sgd_lr = lr * self.sgd
                if group["weight_decay"]:
                    grad = grad.add(p, alpha=group["weight_decay"])
                buffer = state["momentum_buffer"].mul_(beta).add_(grad)
                p.add_(grad.add(buffer, alpha=beta) if nesterov else buffer, alpha=-sgd_lr)
        return None


def load_optimizer_state(optimizer, state):
    """A resumed optimizer: its moments from `state`, its groups' names, rate scales and weight decay from this run
    (the decay is scaled by the batch, which a resume on other GPUs may change; older checkpoints had no names and
    no rate scales)."""
    fresh = [{k: g[k] for k in ("name", "weight_decay", "lr_scale")} for g in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, settings in zip(optimizer.param_groups, fresh):
        group.update(settings)


def lr_factor(epoch, epochs, final_fraction, schedule):
    """Multiplier of lr0 during an epoch: 1 at the start, final_fraction at the end."""
    progress = epoch / max(epochs - 1, 1)
    if schedule == "cosine":
        return final_fraction + (1 - final_fraction) * (1 + math.cos(math.pi * progress)) / 2
    return 1 - (1 - final_fraction) * progress  # linear


def set_learning_rate(optimizer, iteration, epoch, hyp, epochs, warmup_iterations):
    """Set lr (and momentum during warmup) of each group for this iteration. A pure function of
    (iteration, epoch), so a resumed run needs no scheduler state. Warmup: biases start high
    (warmup_bias_lr) and come down, the other groups rise from 0, momentum rises to its value. A group's
    lr_scale (MuSGD's class branches) multiplies the rate it reaches."""
    lr = hyp["lr0"] * lr_factor(epoch, epochs, hyp["lrf"], hyp["schedule"])
    for group in optimizer.param_groups:
        target = lr * group["lr_scale"]
        if iteration < warmup_iterations:
            t = iteration / warmup_iterations
            start = hyp["warmup_bias_lr"] if group["name"].startswith("bias") else 0.0
            group["lr"] = start + (target - start) * t
            m = hyp["warmup_momentum"] + (hyp["momentum"] - hyp["warmup_momentum"]) * t
        else:
            group["lr"] = target
            m = hyp["momentum"]
        if "momentum" in group:
            group["momentum"] = m
        else:
            group["betas"] = (m, group["betas"][1])
    return optimizer.param_groups[-1]["lr"]


def accumulation_windows(epoch, nb, accumulate, warmup_iterations, ramp):
    """{index within the epoch of the last micro-batch of each accumulation window: the window's size}.
    ramp: during the warmup the window grows from 1 micro-batch to `accumulate` (as Ultralytics does: far
    more, smaller optimizer steps while the network is least trained). A window never spans two epochs.
    A pure function of its arguments, so a run resumed at a window's end sees the same windows."""
    windows, start = {}, 0
    while start < nb:
        iteration = epoch * nb + start
        size = accumulate
        if ramp and iteration < warmup_iterations:
            size = max(1, round(1 + (accumulate - 1) * iteration / warmup_iterations))
        end = min(start + size, nb) - 1
        windows[end] = end - start + 1
        start = end + 1
    return windows


def optimizer_step(model, optimizer, scaler, max_norm):
    """Unscale (fp16), clip, and step unless the gradient norm is NaN/Inf; then zero the gradients.
    Returns whether it stepped. Under DDP the gradients are all-reduced by now, so every rank sees the
    same norm and takes the same decision without another collective; a NaN anywhere in the
    accumulation window, on any rank, shows up in it."""
    scaler.unscale_(optimizer)  # clip the true gradients, not the loss-scaled ones
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    finite = bool(torch.isfinite(norm))  # the one host sync of an optimizer step
    if finite:
        # not scaler.step(optimizer): with fp16 it reads unscale_'s found-inf flag back (a second sync), whose
        # answer a finite norm already gives (every gradient finite); scaler.update() still reads the flag on
        # the device to grow or keep the loss scale
        optimizer.step()
    scaler.update()  # fp16: a non-finite step halves the loss scale
    optimizer.zero_grad(set_to_none=True)
    return finite
