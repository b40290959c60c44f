"""YOLO26 and 11n-e2e: their two heads, the NMS-free answer, 11n-e2e's box branch and how a one-to-one head is
assigned and trained (models/head.py, models/yolo.py, utils/assigner.py, utils/loss.py)."""

import numpy as np
import pytest
import torch
from assign_helpers import anchors_for, assign

from models.weights import model_from_checkpoint
from models.yolo import YOLO, assignment_of
from utils.assigner import assign_targets, level_by_size
from utils.loss import DetectionLoss, one_to_many_weight


def test_yolo26_trains_two_heads_without_dfl_and_answers_final_detections():
    model = YOLO("26n", nc=7)
    x = torch.rand(2, 3, 64, 96)
    maps = model.train()(x)
    shapes = [(2, 4 + 7, 8, 12), (2, 4 + 7, 4, 6), (2, 4 + 7, 2, 3)]  # 4 distances, no DFL bins
    for branch in ("one2many", "one2one"):
        assert [tuple(m.shape) for m in maps[branch]] == shapes
    # the one-to-one branch sees detached features: its loss leaves the network to the one-to-many branch
    maps["one2one"][0].sum().backward()
    assert model.stem.conv.weight.grad is None and model.head.one2one_box[0][0].conv.weight.grad is not None
    model.eval()
    with torch.no_grad():
        out = model(x)
    assert model.end2end and out.shape == (2, 8 * 12 + 4 * 6 + 2 * 3, 6)  # fewer anchors than 300: all of them
    assert (out[..., 4] >= 0).all() and (out[..., 4] <= 1).all() and (out[..., 4].diff(dim=1) <= 0).all()
    assert ((out[..., 5] >= 0) & (out[..., 5] < 7) & (out[..., 5] == out[..., 5].round())).all()
    with torch.no_grad():
        assert model(torch.rand(1, 3, 160, 160)).shape == (1, 300, 6)  # 525 anchors: the best 300


def test_11n_e2e_changes_only_its_box_branches_trains_the_network_and_a_checkpoint_rebuilds_it():
    """--model 11n-e2e: YOLO11n's network but for the box branch of both heads (DFL's 16 bins, 32 wide), answering
    without NMS; its one-to-one loss trains the network too. val.py, detect.py and export.py rebuild it from a
    checkpoint that names it, or its earlier name, 11n-d32-stable."""
    torch.manual_seed(0)
    base, model = YOLO("11n", nc=3), YOLO("11n-e2e", nc=3)

    # the network and the one-to-many class branch as 11n's (which has no one-to-one head)
    def shapes(model):
        return {k: v.shape for k, v in model.state_dict().items() if "box." not in k and "one2one" not in k}

    assert shapes(model) == shapes(base) and model.head.reg_max == 16 and model.end2end
    assert [str(level) for level in model.head.one2one_cls] == [str(level) for level in model.head.cls]
    for boxes in (model.head.box, model.head.one2one_box):
        assert all(level[-1].in_channels == 32 and level[-1].out_channels == 4 * 16 for level in boxes)
    maps = model.train()(torch.rand(2, 3, 64, 96))
    o = 4 * 16 + 3
    assert [tuple(m.shape) for m in maps["one2one"]] == [(2, o, 8, 12), (2, o, 4, 6), (2, o, 2, 3)]
    loss_fn = DetectionLoss(model.head)
    loss, parts = loss_fn(maps, torch.tensor([[0.0, 1, 10, 12, 40, 50], [1, 2, 50, 8, 90, 60]]))
    assert torch.isfinite(loss) and (parts > 0).all() and loss_fn.names[2] == "dfl"
    sum(m.sum() for m in maps["one2one"]).backward()
    assert model.stem.conv.weight.grad is not None  # 26n's one-to-one head sees detached features (test above)
    x = torch.rand(1, 3, 160, 160)
    for name in ("11n-e2e", "11n-d32-stable"):
        ckpt = {"scale": name, "nc": 3, "names": ["a", "b", "c"], "imgsz": 64, "model": model.state_dict()}
        rebuilt = model_from_checkpoint(ckpt)  # loaded strictly: every tensor fits
        with torch.no_grad():
            assert model.eval()(x).shape == (1, 300, 6) and rebuilt.end2end and rebuilt.scale == "11n-e2e"
            # per anchor (the top 300 of an untrained model are near ties)
            assert torch.allclose(rebuilt(x, mode="per_anchor"), model(x, mode="per_anchor"), atol=1e-4)


def test_yolo26_answers_with_its_one_to_many_head_for_nms_when_asked():
    """val.py / detect.py / export.py --nms: mode "per_anchor" makes eval answer per anchor, from the one-to-many
    branch (what NMS then reduces), and no mode gives the NMS-free head's answer; a model without one refuses."""
    model = YOLO("26n", nc=7).eval()
    with torch.no_grad():  # the two branches start as copies: tell them apart
        model.head.one2one_cls[0][-1].bias += 1.0
    x = torch.rand(2, 3, 64, 96)
    with torch.no_grad():
        out, maps = model(x, mode="per_anchor"), model(x, mode="maps")
    assert out.shape == (2, 8 * 12 + 4 * 6 + 2 * 3, 4 + 7) and model.end2end
    assert torch.equal(out, model.head.decode(maps["one2many"]))
    assert torch.equal(out, model.head.from_maps(maps, "per_anchor"))
    assert not torch.allclose(out, model.head.decode(maps["one2one"]))
    with torch.no_grad():  # the phone formats' answer: the one-to-one head per anchor, its top 300 picked outside
        assert torch.equal(model(x, mode="one2one_per_anchor"), model.head.decode(maps["one2one"]))
    with torch.no_grad():
        assert model(x).shape == (2, 8 * 12 + 4 * 6 + 2 * 3, 6)
    with pytest.raises(ValueError, match="no one-to-one head"), torch.no_grad():
        YOLO("n", nc=7).eval()(x, mode="end2end")


def test_yolo26_detections_are_the_best_anchor_class_pairs():
    model = YOLO("26n", nc=3).eval()
    model.head.max_det = 4
    decoded = torch.zeros(1, 6, 4 + 3)
    decoded[0, :, :4] = torch.arange(6.0)[:, None]  # anchor i's box is (i, i, i, i)
    decoded[0, :, 4:] = torch.tensor([[0.1, 0.0, 0], [0.9, 0.8, 0], [0, 0, 0.3], [0.2, 0, 0], [0, 0.7, 0], [0, 0, 0]])
    out = model.head.top_detections(decoded)[0]
    # the 4 anchors with the best top score are 1, 4, 2, 3; their 4 best (anchor, class) pairs, one anchor twice
    assert out[:, 4].tolist() == pytest.approx([0.9, 0.8, 0.7, 0.3])
    assert out[:, 5].tolist() == [0, 1, 1, 2] and out[:, 0].tolist() == [1, 1, 4, 2]


@pytest.mark.parametrize("name", ["26n", "11n-e2e"])
def test_yolo26_decodes_only_the_boxes_it_answers_with_and_answers_the_same(name):
    """The NMS-free answer picks its detections by score first and decodes only their boxes (DFL's softmax over
    300 anchors, not all of them): bitwise what decoding every anchor and then picking gives, with and without DFL."""
    torch.manual_seed(0)
    model = YOLO(name, nc=3).eval()
    with torch.no_grad():  # trained-looking heads: spread scores and boxes
        for p in model.head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    with torch.no_grad():
        x = torch.rand(2, 3, 320, 256)
        out, maps = model(x), model(x, mode="maps")
        assert out.shape == (2, 300, 6) and torch.equal(out, model.head.from_maps(maps, "end2end"))
        assert torch.equal(out, model.head.top_detections(model.head.decode(maps["one2one"])))


def test_one_to_one_assignment_by_size_puts_each_object_on_one_level():
    """--model 11n-e2e: each object's one-to-one positive lies on the level its size picks (under 64 px: stride 8,
    under 128: 16, then 32), where the usual assignment takes whichever level aligns best (here not always that)."""
    _, strides = anchors_for(320)
    strides = strides.squeeze(-1)
    boxes = [(0, 20, 20, 70, 70), (1, 100, 100, 190, 190), (2, 10, 10, 300, 300)]  # sizes 50, 90, 290 px
    picked = {}
    for levels in (None, strides):
        _, (_, _, fg, index) = assign([boxes], size=320, topk=7, keep=1, levels=levels)
        picked[levels is None] = sorted((int(index[0, a]), int(strides[a])) for a in fg[0].nonzero().flatten())
    assert picked[False] == [(0, 8), (1, 16), (2, 32)] and picked[True] != picked[False]
    sides = torch.tensor([[[0.0, 0, 63.9, 63.9], [0, 0, 64, 64], [0, 0, 32, 128], [0, 0, 127, 127], [0, 0, 900, 900]]])
    chosen = level_by_size(sides, torch.tensor([8.0, 16, 32]))  # one stride per box: each box's row has one True
    assert chosen.sum(-1).tolist() == [[1] * 5] and chosen.float().argmax(-1).tolist() == [[0, 1, 1, 1, 2]]
    assert assignment_of(YOLO("11n-e2e", nc=3).scale).by_level
    assert not assignment_of(YOLO("26n", nc=3).scale).by_level  # Ultralytics' rule


def test_one_to_one_positive_led_by_the_score_stays_on_the_anchor_that_answers():
    """--model 11n-e2e: the one-to-one positive is chosen by score * IoU ** 2, so an anchor that answers the object
    with a high score keeps it against a neighbour whose box fits a little better; by the usual score ** 0.5 *
    IoU ** 6 (26n, Ultralytics) the better box takes it, whatever the scores."""
    anchors, _ = anchors_for(64)
    gt_boxes, gt_labels, gt_mask = torch.tensor([[[16.0, 16, 48, 48]]]), torch.zeros(1, 1, 1), torch.ones(1, 1, 1)
    scores = torch.full((1, len(anchors), 3), 0.05)
    boxes = torch.cat((anchors - 8, anchors + 8), 1)[None].clone()  # 16x16 around each anchor: IoU 0.25 at most
    fits, answers = [int(((anchors - c) ** 2).sum(1).argmin()) for c in (28.0, 36.0)]
    boxes[0, fits], scores[0, fits, 0] = torch.tensor([16.0, 16, 48, 48]), 0.3  # the box exactly, a low score
    boxes[0, answers], scores[0, answers, 0] = torch.tensor([16.0, 16, 46, 46]), 0.9  # IoU 0.88, a high score
    chosen = {}
    for alpha, beta in ((0.5, 6.0), (1.0, 2.0)):
        _, _, fg, _ = assign_targets(scores, boxes, anchors, gt_labels, gt_boxes, gt_mask, topk=7, keep=1,
                                     alpha=alpha, beta=beta)  # fmt: skip
        chosen[beta] = fg[0].nonzero().flatten().tolist()
    assert chosen == {6.0: [fits], 2.0: [answers]}
    assert assignment_of(YOLO("11n-e2e", nc=3).scale).one2one_alignment == (1.0, 2.0)
    assert assignment_of(YOLO("26n", nc=3).scale).one2one_alignment == (0.5, 6.0)


def test_each_branch_is_assigned_with_its_own_alignment(monkeypatch):
    """11n-e2e: the one-to-one positives are chosen by score * IoU ** 2, the one-to-many ones by the usual score ** 0.5
    * IoU ** 6. Read from the loss's two assignments of a training step."""
    used, fp32_loss = {}, DetectionLoss.fp32_loss

    def spy(self, maps, padded, keep=None, **settings):
        used["one2one" if keep == 1 else "one2many"] = settings.get("alignment", (0.5, 6.0))
        return fp32_loss(self, maps, padded, keep=keep, **settings)

    monkeypatch.setattr(DetectionLoss, "fp32_loss", spy)
    model = YOLO("11n-e2e", nc=3).train()
    loss_fn = DetectionLoss(model.head, assignment=assignment_of(model.scale))  # as train.py builds it
    loss_fn(model(torch.rand(1, 3, 64, 64)), torch.tensor([[0, 0, 8, 8, 40, 36]]))
    assert used == {"one2one": (1.0, 2.0), "one2many": (0.5, 6.0)}


def test_yolo26_loss_one_positive_per_object_progressive_weight_and_it_learns():
    assert [round(one_to_many_weight(e, 8), 4) for e in (0, 4, 7, 9)] == [0.8, 0.4, 0.1, 0.1]  # linear, then held
    assert [one_to_many_weight(e, 8, final=0.8) for e in (0, 4, 7)] == [0.8, 0.8, 0.8]  # --o2m-final 0.8: constant
    _, (_, _, fg, assigned) = assign([[(0, 4, 4, 40, 40), (1, 30, 20, 60, 60)]], keep=1)
    assert fg.sum() == 2 and sorted(assigned[fg].tolist()) == [0, 1]  # the one-to-one rule: one anchor per box
    torch.manual_seed(0)
    model = YOLO("26n", nc=3).train()
    loss_fn = DetectionLoss(model.head, epochs=10)
    images = torch.rand(2, 3, 64, 64)
    targets = torch.tensor([[0, 0, 8, 8, 40, 36], [0, 2, 30, 30, 60, 62], [1, 1, 4, 20, 24, 44]])
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    history = []
    for _ in range(25):
        loss, parts = loss_fn(model(images), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append(loss.item())
    assert np.mean(history[-5:]) < 0.5 * np.mean(history[:5]) and parts.shape == (3,)
    maps = model(images)
    loss_fn.epoch = 9  # the last epoch: 0.1 one-to-many, 0.9 one-to-one
    late = loss_fn(maps, targets)[0]
    padded = loss_fn.padded(targets, images)
    one2one = loss_fn.fp32_loss(maps["one2one"], padded, topk=7, keep=1)[0]
    one2many = loss_fn.fp32_loss(maps["one2many"], padded)[0]
    assert torch.allclose(late, 0.1 * one2many + 0.9 * one2one)
