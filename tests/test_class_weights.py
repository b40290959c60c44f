"""--cls-weights (issue 26): the weights `auto` computes from the training labels, the parsing of a list, and their
effect on the class term of the loss. The end-to-end runs (args.yaml, resume, the bad-list sentence) are in
test_train_resume.py and test_train_faults.py."""

import types

import pytest
import torch

from utils.loss import CLASS_WEIGHT_CAP, DetectionLoss, resolve_class_weights

STRIDES = (8, 16, 32)


def class_ids(counts):
    """One class id per box, `counts[c]` boxes of class c, shuffled as labels come."""
    ids = torch.cat([torch.full((n,), c) for c, n in enumerate(counts)])
    return ids[torch.randperm(len(ids), generator=torch.Generator().manual_seed(0))].float().numpy()


def test_auto_weights_are_inverse_frequency_with_mean_1():
    text, weights = resolve_class_weights("auto", class_ids([50, 25, 100]), 3)
    # 1/50 : 1/25 : 1/100 = 2 : 4 : 1, scaled to mean 1
    assert weights == pytest.approx([6 / 7, 12 / 7, 3 / 7], rel=1e-12)
    assert sum(weights) / 3 == pytest.approx(1, rel=1e-12)
    assert [float(w) for w in text.split(",")] == weights  # the text args.yaml keeps gives the very same floats


def test_auto_weights_are_capped_and_an_absent_class_gets_the_cap():
    counts = [1000, 10, 1, 0]  # inverse 0.001, 0.1, 1, inf: all but the first are past 10x the smallest
    _, weights = resolve_class_weights("auto", class_ids(counts), 4)
    assert max(weights) / min(weights) == pytest.approx(CLASS_WEIGHT_CAP)
    assert weights[1] == weights[2] == weights[3] and weights[0] < weights[1]
    assert sum(weights) / 4 == pytest.approx(1, rel=1e-12) and all(w < float("inf") for w in weights)
    _, within = resolve_class_weights("auto", class_ids([40, 10]), 2)
    assert within[1] / within[0] == pytest.approx(4)  # under the cap: the plain inverse ratio
    assert resolve_class_weights("auto", class_ids([0, 0]), 2)[1] == [1.0, 1.0]  # no boxes: nothing to weigh


def test_a_list_is_used_as_written_and_off_is_none():
    assert resolve_class_weights("1,2.5,0", [], 3) == ("1.0,2.5,0.0", [1.0, 2.5, 0.0])
    assert resolve_class_weights("[1, 2]", [], 2)[1] == [1.0, 2.0]  # a dataset yaml's defaults: may be a list
    assert resolve_class_weights("", [0, 1], 2) == ("", None)


@pytest.mark.parametrize(
    "text, words",
    [
        ("1,2", ["--cls-weights 1,2 has 2 numbers", "nc=3", "give auto or 3 comma-separated numbers"]),
        ("1,2,3,4", ["has 4 numbers", "nc=3"]),
        ("1,x,3", ["--cls-weights 1,x,3: 'x' is not a number", "give auto or 3 comma-separated", "nc=3"]),
        ("1,-1,2", ["negative or not finite", "nc=3"]),
        ("1,nan,2", ["negative or not finite"]),
        ("Auto", ["'Auto' is not a number"]),
    ],
)
def test_a_bad_list_gets_one_sentence_naming_the_flag_and_nc(text, words):
    with pytest.raises(ValueError) as error:
        resolve_class_weights(text, [0, 1, 2], 3)
    message = str(error.value)
    assert all(w in message for w in words), message
    assert "\n" not in message


def batch(nc, b=2, imgsz=128, seed=0):
    """Head outputs and a few boxes of every class."""
    g = torch.Generator().manual_seed(seed)
    maps = [torch.randn(b, 64 + nc, imgsz // s, imgsz // s, generator=g).requires_grad_() for s in STRIDES]
    rows = [[i % b, i % nc, 10 + 7 * i, 12 + 5 * i, 50 + 9 * i, 48 + 8 * i] for i in range(2 * nc)]
    return maps, torch.tensor(rows, dtype=torch.float32)


def loss_and_class_gradient(nc, class_weights):
    maps, targets = batch(nc)
    loss, parts = DetectionLoss(types.SimpleNamespace(nc=nc, reg_max=16, strides=STRIDES), class_weights=class_weights)(
        maps, targets
    )
    loss.backward()
    gradient = torch.cat([m.grad.flatten(2) for m in maps], 2)  # b, 64 + nc, anchors
    return loss, parts, gradient


def test_weights_of_one_give_bitwise_the_loss_without_weights():
    """The default (no --cls-weights) is the plain BCE: ones, which multiply exactly, change nothing at all."""
    plain, plain_parts, plain_gradient = loss_and_class_gradient(4, None)
    ones, ones_parts, ones_gradient = loss_and_class_gradient(4, [1.0] * 4)
    assert torch.equal(plain, ones) and torch.equal(plain_parts, ones_parts)
    assert torch.equal(plain_gradient, ones_gradient)


def test_a_class_weight_scales_that_class_channel_alone():
    """Positives and negatives of the weighted class's channel get 3x the gradient; the other classes' channels and
    the box terms are untouched (the label assignment does not depend on the weights)."""
    nc, k = 4, 2
    plain, plain_parts, plain_gradient = loss_and_class_gradient(nc, None)
    weighted, parts, gradient = loss_and_class_gradient(nc, [1.0, 1.0, 3.0, 1.0])
    assert parts[1] > plain_parts[1] and torch.equal(parts[[0, 2]], plain_parts[[0, 2]])
    channel = 64 + k
    assert torch.equal(gradient[:, :channel], plain_gradient[:, :channel])  # box/DFL bins and classes 0, 1
    assert torch.equal(gradient[:, channel + 1 :], plain_gradient[:, channel + 1 :])
    assert torch.allclose(gradient[:, channel], 3 * plain_gradient[:, channel], rtol=1e-5, atol=1e-12)
    assert (plain_gradient[:, channel] > 0).any() and (plain_gradient[:, channel] < 0).any()  # negatives, positives


def test_shapes_with_class_odds_draw_the_train_split_imbalanced_and_the_val_split_even(tmp_path):
    """The generator of an imbalanced set (bench/RESULTS.md, "Rare classes"): circle 20 : star 1 in train, only those
    two in val, evenly."""
    from utils.data.shapes import make_shapes

    odds = [20, 0, 0, 1, 0, 0]
    make_shapes(tmp_path, n_train=40, n_val=30, seed=0, size=96, class_odds=odds)

    def counts(split):
        found = [0] * 6
        for path in (tmp_path / "labels" / split).glob("*.txt"):
            for line in path.read_text().splitlines():
                found[int(line.split()[0])] += 1
        return found

    train, val = counts("train"), counts("val")
    assert train[1:3] == train[4:] == val[1:3] == val[4:] == [0, 0]  # odds 0: never drawn
    assert train[0] > 8 * train[3] and val[3] > 0.6 * val[0]
