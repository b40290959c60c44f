"""MuSGD (utils/optim.py): Muon's orthogonalised step on conv weights plus SGD, and its state across a resume."""

import copy

import pytest
import torch

from models.yolo import YOLO
from utils.optim import MuSGD, build_optimizer, newton_schulz_orthogonalise, set_learning_rate


def test_newton_schulz_makes_the_singular_values_about_one():
    torch.manual_seed(0)
    matrix = torch.randn(24, 72) @ torch.diag(torch.logspace(-2, 1, 72))  # badly conditioned
    singular = torch.linalg.svdvals(newton_schulz_orthogonalise(matrix).float())
    assert singular.min() > 0.3 and singular.max() < 1.6  # from 1000:1 to about 1:1


def test_musgd_steps_conv_weights_and_its_state_resumes_exactly():
    torch.manual_seed(0)
    model = YOLO("26n", nc=2).train()
    optimizer = build_optimizer(model, "musgd", 0.01, 0.9, 5e-4)
    assert isinstance(optimizer, MuSGD)
    # biases, BN, conv weights: of the class branches (both heads' copies), then of the rest
    assert [g["use_muon"] for g in optimizer.param_groups] == [False, False, True] * 2
    x = torch.rand(2, 3, 64, 64)

    def step(model, optimizer):
        maps = model(x)
        loss = sum(m.float().square().mean() for m in maps["one2many"] + maps["one2one"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    before = model.stem.conv.weight.clone()
    step(model, optimizer)
    assert not torch.equal(before, model.stem.conv.weight)
    state = optimizer.state[model.stem.conv.weight]
    assert set(state) == {"momentum_buffer", "muon_buffer"}
    # a second model resumed from the first's weights and optimizer state takes bitwise the same next step
    resumed = copy.deepcopy(model)
    resumed_optimizer = build_optimizer(resumed, "musgd", 0.01, 0.9, 5e-4)
    resumed_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    step(model, optimizer)
    step(resumed, resumed_optimizer)
    for a, b in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


def test_musgd_trains_the_class_branches_at_3x_the_rate_and_the_other_optimizers_do_not():
    """Ultralytics' MuSGD: every parameter of the class branches (cls, one2one_cls) at 3x the learning rate, in the
    warmup and after it; the rate logged (the last group's) is the plain one; AdamW and SGD keep one rate."""
    model = YOLO("26n", nc=2)
    hyp = dict(lr0=0.01, lrf=0.01, schedule="linear", warmup_bias_lr=0.1, warmup_momentum=0.8, momentum=0.9)
    optimizer = build_optimizer(model, "musgd", 0.01, 0.9, 5e-4)
    in_cls = {id(p) for name, p in model.named_parameters() if name.startswith(("head.cls.", "head.one2one_cls."))}
    assert len(in_cls) > 10
    for group in optimizer.param_groups:  # exactly the class branches' parameters are in the *_cls groups
        assert all((id(p) in in_cls) == group["name"].endswith("_cls") for p in group["params"]), group["name"]
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(model.parameters()))
    for iteration, epoch in ((50, 0), (500, 3)):  # in the warmup (100 iterations) and after it
        logged = set_learning_rate(optimizer, iteration, epoch, hyp, epochs=10, warmup_iterations=100)
        rate = {g["name"]: g["lr"] for g in optimizer.param_groups}
        assert logged == rate["decay"] > 0 and rate["decay_cls"] == pytest.approx(3 * rate["decay"])
        assert rate["no_decay_cls"] == pytest.approx(3 * rate["no_decay"])
        assert rate["bias_cls"] > rate["bias"]  # the biases' warmup starts from the same warmup_bias_lr
    for name in ("adamw", "sgd"):
        optimizer = build_optimizer(model, name, 0.01, 0.9, 5e-4)
        set_learning_rate(optimizer, 500, 3, hyp, epochs=10, warmup_iterations=100)
        assert len(optimizer.param_groups) == 3 and len({g["lr"] for g in optimizer.param_groups}) == 1
