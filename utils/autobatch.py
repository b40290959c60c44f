"""--batch -1: the largest batch that fits in a share of the GPU's free memory, measured, not guessed."""

import logging

import numpy as np
import torch

SHARE = 0.6  # of the free GPU memory: room for more boxes per image, fragmentation, the validation pass
# At most this many images per GPU: lr0 and the warmup are tuned for steps of 16 to 64 images (--nominal-batch), and
# the weight decay grows with the batch; thousands of small images would fit an 80 GB GPU and train in a few huge steps.
MAX_BATCH = 256
log = logging.getLogger("yolo")


def batch_from_memory(model, imgsz, device, amp_dtype, world_size, default):
    """--batch -1: the batch one GPU fits, measured at `imgsz` (under --multi-scale: the largest size the run
    draws, else a quarter of its iterations need more than was measured), at most MAX_BATCH; on a CPU there is
    nothing to measure: `default`."""
    if world_size > 1:
        raise SystemExit(
            "--batch -1 measures one GPU; under torchrun give the total --batch "
            "(e.g. the single-GPU figure times the GPUs)"
        )
    if device.type != "cuda":
        log.warning(f"--batch -1 measures free GPU memory and needs a CUDA device; using --batch {default}")
        return default
    batch = auto_batch_size(model, imgsz, device, amp_dtype)
    if batch > MAX_BATCH:
        log.info(f"--batch -1: {batch} images would fit {device} at {imgsz} px; capped at {MAX_BATCH}")
        return MAX_BATCH
    log.info(f"--batch -1: batch {batch} uses about {SHARE:.0%} of {device}'s free memory at {imgsz} px")
    return batch


def fit_batch_size(memory_at, free_bytes, share=SHARE, probes=(1, 2, 4, 8, 16)):
    """Fit memory = fixed + per_image * batch to the memory measured at a few batch sizes
    (`memory_at(b)`: bytes, or None when b ran out of memory) and solve for `share` of `free_bytes`.
    Never more than the first size that ran out of memory, never less than 1."""
    sizes, used, ceiling = [], [], None
    for b in probes:
        bytes_used = memory_at(b)
        if bytes_used is None:
            ceiling = b - 1
            break
        sizes.append(b)
        used.append(bytes_used)
    if len(sizes) < 2:
        return max(sizes or [1])
    per_image, fixed = np.polyfit(sizes, used, 1)
    batch = int((share * free_bytes - fixed) / max(per_image, 1.0) + 1e-3)  # the fit's rounding must not cost an image
    return max(1, min(batch, ceiling) if ceiling else batch)


def auto_batch_size(model, imgsz, device, amp_dtype=None, share=SHARE):
    """Measure a training step's peak memory at batch 1..16 and fit the batch that uses `share` of the memory
    free now. `model` is a probe of the run's size (train.py builds one for this): its BN statistics change."""
    probe = model.train()
    free, _ = torch.cuda.mem_get_info(device)

    def memory_at(b):
        ran_out = False
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        try:
            x = torch.zeros(b, 3, imgsz, imgsz, device=device).contiguous(memory_format=torch.channels_last)
            with torch.autocast("cuda", dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
                outputs = probe(x)
            sum(o.float().sum() for o in outputs).backward()
        except torch.OutOfMemoryError:
            ran_out = True
        probe.zero_grad(set_to_none=True)
        return None if ran_out else torch.cuda.max_memory_allocated(device) - start

    # the probe's memory stays in torch's cache, for the training to reuse
    return fit_batch_size(memory_at, free, share)
