"""The schedule a fine-tuning run (--weights) resolves to, measured on the real suite's small sets
(docs/training.md, "Fine-tuning without forgetting")."""

from argparse import Namespace

from models.yolo import YOLO
from utils.optim import build_optimizer, set_learning_rate
from utils.settings import resolve_optimizer, warmup_length

HYP = dict(lr0=0.002, lrf=0.01, schedule="linear", warmup_bias_lr=0.1, warmup_momentum=0.8, momentum=0.937)


def fine_tuning_schedule(epochs, batches):
    """(lr0, warmup iterations, the weights' rate at every iteration) of a fine-tuning AdamW run with the defaults."""
    args = Namespace(optimizer="auto", lr0="auto", nominal_batch="auto", batch=16, epochs=epochs, warmup_epochs=3.0)
    args.warmup_bias_lr, args.momentum, args.ema_floor = "auto", "auto", "auto"
    chosen = resolve_optimizer(args, batches, {}, fine_tuning=True)
    lr0, bias_lr = chosen["lr0"], chosen["warmup_bias_lr"]
    warmup = warmup_length(args.warmup_epochs, batches)
    optimizer = build_optimizer(YOLO("n", nc=2), "adamw", lr0, 0.937, 5e-4)
    hyp = {**HYP, "lr0": lr0, "warmup_bias_lr": bias_lr}
    rates = [
        set_learning_rate(optimizer, epoch * batches + i, epoch, hyp, epochs, warmup)
        for epoch in range(epochs)
        for i in range(batches)
    ]
    return lr0, warmup, rates


def test_a_short_fine_tuning_run_keeps_the_100_iteration_warmup_floor():
    """10 epochs of 8 batches (microcontrollers, 121 photos): the whole run lies inside the 100-iteration warmup, so
    the weights' rate rises to about a fifth of lr0 mid-run and falls to nearly 0 by the end. Shortening the warmup
    to one epoch (lr0 then 0.00143 from iteration 8) collapsed that run: 0.022 mAP50-95 after 10 epochs against
    0.690, below 0.013 from epoch 2 to 7 (seed 0). A rule that shortens a fine-tuning run's warmup must beat that."""
    lr0, warmup, rates = fine_tuning_schedule(epochs=10, batches=8)
    assert warmup == 100 and len(rates) == 80 and lr0 == 0.002
    peak = max(rates)
    assert 0.15 * lr0 < peak < 0.25 * lr0
    assert rates.index(peak) in range(32, 48)  # epoch 5 of 10
    assert max(rates[-8:]) < 0.1 * peak


def test_the_ema_floor_averages_about_the_last_ten_steps_until_the_usual_ramp_passes_it():
    """ModelEMA(floor=0.9), a long fine-tuning run's: the EMA keeps about 0.9 of itself a step from the first few
    steps on, so on weights that climb by 1 a step it lags about 8 steps behind, where the usual EMA (tau 2000) of a
    50-step run is the last step's weights; after ~4,600 updates the usual ramp (0.9999) takes over."""
    import torch

    from utils.ema import ModelEMA

    def lag_after(updates, floor, start=0):
        model = torch.nn.Linear(1, 1, bias=False)
        torch.nn.init.zeros_(model.weight)
        ema = ModelEMA(model, floor=floor, updates=start)
        for step in range(1, updates + 1):
            torch.nn.init.constant_(model.weight, step)
            ema.update(model)
        return updates - ema.ema.weight.item()

    assert 7 < lag_after(50, 0.9) < 9  # a ramp's EMA lags d / (1 - d) steps (0.894: 8.4), less while d ramps up
    assert lag_after(50, 0.0) < 0.05
    assert lag_after(1, 0.9, start=10_000) > 0.99  # 0.9999 * (1 - exp(-5)) = 0.993 > 0.9: one step moves it ~0.007
