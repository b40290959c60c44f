"""The network, the assigner, the loss and post-processing (issue 3)."""

import numpy as np
import pytest
import torch
from assign_helpers import anchors_for, assign

from models.yolo import SCALES, YOLO, count_gflops, count_parameters
from utils.assigner import assign_targets
from utils.boxes import non_max_suppression, scale_boxes_to_original
from utils.data.augment import letterbox
from utils.loss import DetectionLoss

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("scale", [s for s in SCALES if not s.startswith("26")])
def test_output_shapes_every_scale_and_non_square_input(scale):
    model = YOLO(scale, nc=7)
    x = torch.rand(2, 3, 64, 96)
    maps = model.train()(x)
    assert [tuple(m.shape) for m in maps] == [(2, 64 + 7, 8, 12), (2, 64 + 7, 4, 6), (2, 64 + 7, 2, 3)]
    model.eval()
    with torch.no_grad():
        out = model(x)
    assert out.shape == (2, 8 * 12 + 4 * 6 + 2 * 3, 4 + 7)
    boxes, scores = out[..., :4], out[..., 4:]
    assert (scores >= 0).all() and (scores <= 1).all()
    assert (boxes[..., 2] >= boxes[..., 0]).all() and (boxes[..., 3] >= boxes[..., 1]).all()


def test_every_model_has_the_parameter_count_ultralytics_publishes():
    # The summaries in Ultralytics' yolov8.yaml and yolo11.yaml (80 classes), less the 16 fixed weights of its
    # DFL layer, which our head holds as a constant: same count, same layers (their checkpoints load strictly).
    published = {"n": 3157200, "s": 11166560, "m": 25902640, "l": 43691520, "x": 68229648}
    published |= {"11n": 2624080, "11s": 9458752, "11m": 20114688, "11l": 25372160, "11x": 56966176}
    # yolo26.yaml's summaries: no DFL layer, both heads (one-to-many and one-to-one) counted
    yolo26 = {"26n": 2572280, "26s": 10009784, "26m": 21896248, "26l": 26299704, "26x": 58993368}
    for scale, count in (published | yolo26).items():
        with torch.device("meta"):  # shapes only: no memory, no time
            model = YOLO(scale, nc=80)
        assert count_parameters(model) == count - 16 * (scale not in yolo26), scale


def test_n_model_is_in_the_size_class_users_know():
    model = YOLO("n", nc=80)
    params = count_parameters(model)
    gflops = count_gflops(model, 640)
    assert 2.0e6 <= params <= 3.5e6, params
    assert 6.0 <= gflops <= 9.0, gflops
    assert count_parameters(YOLO("s", nc=80)) > 3 * params  # the scales really scale


def test_assigner_one_box_picks_anchors_inside_it():
    anchors, (target_boxes, target_scores, fg, idx) = assign([[(2, 16, 16, 48, 40)]], topk=10)
    inside = (anchors[:, 0] > 16) & (anchors[:, 0] < 48) & (anchors[:, 1] > 16) & (anchors[:, 1] < 40)
    assert 1 <= fg[0].sum() <= 10
    assert inside[fg[0]].all()  # only anchors whose centre is in the box
    assert torch.equal(target_boxes[0, fg[0]], torch.tensor([[16.0, 16, 48, 40]]).expand(int(fg[0].sum()), -1))
    assert (target_scores[0, fg[0]].argmax(1) == 2).all()  # the box's class
    assert target_scores[0, ~fg[0]].sum() == 0  # background anchors learn "nothing here"
    assert target_scores.max() <= 1


def test_assigner_overlapping_boxes_each_anchor_goes_to_one_box():
    # two boxes sharing a region; each shared anchor must be given to exactly one of them
    _, (_, target_scores, fg, idx) = assign([[(0, 8, 8, 40, 40), (1, 24, 24, 56, 56)]], topk=13)
    assert fg[0].sum() > 0
    assert set(idx[0, fg[0]].tolist()) == {0, 1}  # both boxes get anchors
    assert ((target_scores[0] > 0).sum(1) <= 1).all()  # never two classes for one anchor


def test_assigner_prefers_the_box_its_prediction_overlaps_most():
    anchors, _ = anchors_for(64)
    shared = int(((anchors - torch.tensor([28.0, 28.0])).abs().sum(1)).argmin())  # anchor at (28, 28)
    pred = torch.cat((anchors - 8, anchors + 8), 1)[None].clone()
    pred[0, shared] = torch.tensor([24.0, 24, 40, 40])  # its prediction sits on the second box
    _, (_, _, fg, idx) = assign([[(0, 8, 8, 36, 36), (1, 20, 20, 44, 44)]], pred_boxes=pred, topk=20)
    assert fg[0, shared] and idx[0, shared] == 1


def test_assigner_no_boxes_and_padded_batch():
    _, (target_boxes, target_scores, fg, _) = assign([[], []])
    assert not fg.any() and target_scores.sum() == 0
    _, (_, target_scores, fg, _) = assign([[(1, 8, 8, 40, 40), (0, 30, 30, 60, 60)], []])
    assert fg[0].any() and not fg[1].any() and target_scores[1].sum() == 0


def test_assigner_tiny_box_between_anchor_centres_still_gets_an_anchor():
    # a 3x3 box at (5..8, 5..8): no stride-8 anchor centre (4, 12, ...) lies inside it
    anchors, (_, _, fg, _) = assign([[(0, 5, 5, 8, 8)]])
    assert fg[0].sum() >= 1
    nearest = anchors[fg[0]]
    assert ((nearest - torch.tensor([6.5, 6.5])).abs() <= 8).all()  # the neighbouring cells only


def test_assigner_tiny_box_grows_tiny_sides_only():
    # a 4x4 box holds no anchor centre; grown to 8.5 px it reaches one cell row/column, grown to 16 (Ultralytics'
    # rule: sides under 16 px count as 16) two: more candidates. A 12x12 box is grown by 16 only, a 24x24 box by
    # neither.
    anchors, _ = anchors_for(64)
    candidates = {}
    for name, box in (("tiny", (9, 9, 13, 13)), ("medium", (7, 7, 19, 19)), ("large", (10, 10, 34, 34))):
        exact = torch.tensor(box, dtype=torch.float32).expand(1, len(anchors), 4)  # every candidate aligns equally
        for grow in (8.5, 16):
            _, (_, _, fg, _) = assign([[(0, *box)]], pred_boxes=exact, tiny_box=grow, topk=30)
            candidates[name, grow] = fg[0].nonzero().flatten().tolist()
    assert 1 <= len(candidates["tiny", 8.5]) < len(candidates["tiny", 16])
    assert 1 <= len(candidates["medium", 8.5]) < len(candidates["medium", 16])
    assert candidates["large", 8.5] == candidates["large", 16]


@pytest.mark.parametrize("device", DEVICES)
def test_assigner_on_cpu_equals_assigner_on_original_device(device):
    torch.manual_seed(0)
    anchors, _ = anchors_for(128)
    b, n, nc = 2, 5, 4
    xy = torch.rand(b, n, 2) * 100
    gt_boxes = torch.cat((xy, xy + 4 + torch.rand(b, n, 2) * 40), 2)
    gt_labels = torch.randint(0, nc, (b, n, 1)).float()
    gt_mask = torch.ones(b, n, 1, dtype=torch.bool)
    gt_mask[1, 3:] = False
    scores = torch.rand(b, len(anchors), nc)
    pred = torch.cat(
        (anchors - 10 * torch.rand(len(anchors), 2), anchors + 10 * torch.rand(len(anchors), 2)), 1
    ).expand(b, -1, -1)
    args = [t.to(device) for t in (scores, pred, anchors, gt_labels, gt_boxes, gt_mask)]
    here = assign_targets(*args)
    on_cpu = assign_targets(*args, device="cpu")
    for a, c in zip(here, on_cpu):
        assert c.device == a.device  # results come back where the caller lives
        assert torch.allclose(a.float(), c.float(), atol=1e-5)


def test_loss_is_finite_and_falls_when_overfitting_one_batch():
    torch.manual_seed(0)
    model = YOLO("n", nc=3).train()
    loss_fn = DetectionLoss(model.head)
    images = torch.rand(2, 3, 64, 64)
    targets = torch.tensor([[0, 0, 8, 8, 40, 36], [0, 2, 30, 30, 60, 62], [1, 1, 4, 20, 24, 44]])
    empty = torch.zeros(0, 6)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    history = []
    for _ in range(40):
        loss, parts = loss_fn(model(images), targets)
        assert torch.isfinite(loss) and parts.shape == (3,)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append(loss.item())
    assert np.mean(history[-5:]) < 0.5 * np.mean(history[:5])
    loss, parts = loss_fn(model(images), empty)  # a batch of background images only
    assert torch.isfinite(loss) and parts[0] == 0 and parts[2] == 0


def test_loss_is_normalised_per_image_and_per_box():
    torch.manual_seed(0)
    model = YOLO("n", nc=2).eval()  # eval: BN statistics do not depend on the batch
    loss_fn = DetectionLoss(model.head)
    image = torch.rand(1, 3, 128, 128)
    # enough boxes that the soft targets sum past 1 (below that the normaliser is clamped at 1, as in YOLOv8)
    box = torch.tensor(
        [
            [0, k % 2, x, y, x + 30, y + 36]
            for k, (x, y) in enumerate([(4, 4), (60, 8), (20, 70), (80, 80), (40, 40), (90, 30)])
        ],
        dtype=torch.float32,
    )
    with torch.no_grad():
        maps_one = model.head.train()([f for f in _features(model, image)])
        maps_two = model.head.train()([f for f in _features(model, image.expand(2, -1, -1, -1))])
        total_one, parts_one = loss_fn(maps_one, box)
        total_two, parts_two = loss_fn(maps_two, torch.cat((box, box + torch.tensor([1.0, 0, 0, 0, 0, 0]))))
        # the same image twice: the same per-image terms, twice the total (a sum over images)
        assert torch.allclose(parts_one, parts_two, atol=1e-5)
        assert torch.allclose(total_two, 2 * total_one, atol=1e-4)
        # 100 boxes: the box terms are weighted means over assigned anchors, so they stay bounded
        many = torch.tensor(
            [[0, 0, x, y, x + 12, y + 12] for x in range(0, 120, 12) for y in range(0, 120, 12)], dtype=torch.float32
        )
        _, parts_many = loss_fn(maps_one, many)
    assert parts_many[0] <= 2 * 7.5 and parts_many[2] <= 1.5 * 4  # CIoU loss <= 2 per box; DFL a few nats


def _features(model, x):
    """The three feature maps the head sees (the model's forward without the head)."""
    seen = []
    hook = model.head.register_forward_pre_hook(lambda module, inputs: seen.append(inputs[0]))
    try:
        model(x)
    finally:
        hook.remove()
    return seen[0]


def test_nms_same_class_keeps_higher_score_and_different_classes_keep_both():
    # prediction rows: x1 y1 x2 y2, then 2 class scores
    pred = torch.tensor(
        [
            [
                [10.0, 10, 50, 50, 0.9, 0.0],
                [12, 12, 52, 52, 0.6, 0.0],
                [11, 11, 51, 51, 0.0, 0.8],
                [200, 200, 220, 220, 0.1, 0.0],
            ]
        ]
    )
    (det,) = non_max_suppression(pred, conf=0.25, iou=0.5)
    assert det.shape == (2, 6)
    assert torch.allclose(det[:, 4], torch.tensor([0.9, 0.8]))
    assert det[:, 5].tolist() == [0.0, 1.0]
    (only_one,) = non_max_suppression(pred, conf=0.25, iou=0.5, classes=[1])
    assert only_one[:, 5].tolist() == [1.0]
    (capped,) = non_max_suppression(pred, conf=0.25, iou=0.5, max_det=1)
    assert len(capped) == 1 and capped[0, 4] == pytest.approx(0.9)


def test_fused_model_gives_the_same_output():
    torch.manual_seed(0)
    model = YOLO("n", nc=4)
    model.train()
    with torch.no_grad():  # give BN non-trivial running statistics
        for _ in range(3):
            model(torch.rand(2, 3, 64, 64) * 2)
    model.eval()
    x = torch.rand(1, 3, 64, 96)
    with torch.no_grad():
        before = model(x)
        after = model.fuse()(x)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    assert torch.allclose(before, after, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("shape", [(300, 500), (320, 400), (333, 517)])
def test_letterbox_inverse_returns_the_original_box(shape):
    img = np.zeros((*shape, 3), np.uint8)
    box = torch.tensor([[40.0, 60.0, 220.0, 250.0]])
    out, ratio, pad = letterbox(img, (256, 256))
    assert out.shape == (256, 256, 3)
    # where the box's corners land in the resized image: each side was rounded to whole pixels
    per_axis = torch.tensor([round(shape[1] * ratio) / shape[1], round(shape[0] * ratio) / shape[0]])
    in_network = box * per_axis.repeat(2) + torch.tensor([pad[0], pad[1], pad[0], pad[1]])
    back = scale_boxes_to_original(in_network, ratio, pad, shape)
    assert torch.allclose(back, box, atol=1e-4)


@pytest.mark.parametrize("scale", ["n", "11n"])
def test_activation_checkpointing_gives_the_same_gradients_and_bn_statistics(scale):
    """The backward pass runs each checkpointed block's forward again: its BatchNorm layers used to update their
    running statistics a second time (num_batches_tracked 2 after one step: twice the momentum)."""
    torch.manual_seed(0)
    plain = YOLO(scale, nc=2).train()
    recomputed = YOLO(scale, nc=2, checkpoint_activations=True).train()
    recomputed.load_state_dict(plain.state_dict())
    x = torch.rand(2, 3, 64, 64)
    for m in (plain, recomputed):
        sum(o.float().square().mean() for o in m(x)).backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), recomputed.named_parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-5, rtol=1e-4), name
    theirs = dict(recomputed.named_buffers())
    for name, ours in plain.named_buffers():
        assert torch.equal(theirs[name], ours), (name, theirs[name].flatten()[:3], ours.flatten()[:3])
    assert {int(m.num_batches_tracked) for m in recomputed.modules() if isinstance(m, torch.nn.BatchNorm2d)} == {1}
