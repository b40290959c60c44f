"""MuSGD (utils/optim.py): Muon's orthogonalised step on conv weights plus SGD, and its state across a resume."""

import copy

import torch

from models.yolo import YOLO
from utils.optim import MuSGD, build_optimizer, newton_schulz_orthogonalise


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
    assert [g["use_muon"] for g in optimizer.param_groups] == [False, False, True]  # biases, BN, conv weights
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
