"""Exponential moving average of the model weights: what validation, best.pt and export use."""

import copy
import math

import torch


class ModelEMA:
    """ema = decay * ema + (1 - decay) * weights, with decay ramping up from 0 so that the average is
    not dominated by the random initial weights: decay(updates) = decay * (1 - exp(-updates / tau)). In a run of a
    few hundred steps that stays near 0, and the EMA is the last step's weights, which at a high rate are noisy
    (bench/RESULTS.md#fine-tuning-without-forgetting-measured-not-solved). `floor` (--ema-floor; the fine-tuning
    table's long runs set it) keeps the decay at least floor * (1 - exp(-updates * (1 - floor))): an average of about
    the last 1 / (1 - floor) steps from the first few on, until the usual ramp passes it."""

    def __init__(self, model, decay=0.9999, tau=2000, updates=0, floor=0.0):
        self.ema = copy.deepcopy(unwrap(model)).eval()  # always eval: BN uses running stats (pitfall M1)
        self.decay, self.tau, self.updates, self.floor = decay, tau, updates, floor
        for p in self.ema.parameters():
            p.requires_grad_(False)

    @torch.no_grad()  # pitfall E1: an EMA update must never keep the autograd graph alive
    def update(self, model):
        self.updates += 1
        d = self.decay * (1 - math.exp(-self.updates / self.tau))
        d = max(d, self.floor * (1 - math.exp(-self.updates * (1 - self.floor))))
        weights = unwrap(model).state_dict()
        floats, float_weights, ints, int_weights = [], [], [], []
        for name, value in self.ema.state_dict().items():
            if value.dtype.is_floating_point:
                floats.append(value)
                float_weights.append(weights[name].detach())
            else:  # integer buffers (BN's num_batches_tracked) are copied
                ints.append(value)
                int_weights.append(weights[name])
        # ema + (1 - d) * (weights - ema): one fused kernel launch for all the tensors, not two per tensor
        torch._foreach_lerp_(floats, float_weights, 1 - d)
        if ints:
            torch._foreach_copy_(ints, int_weights)


def unwrap(model):
    """The plain model inside DDP (and torch.compile) wrappers."""
    model = getattr(model, "_orig_mod", model)
    return model.module if hasattr(model, "module") else model
