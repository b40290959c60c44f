"""NMS-free variants of YOLO26n's head, and of YOLO26's head on YOLO11n's network: `--model NAME` builds one.

Each changes the box branch, how the one-to-one (NMS-free) head is assigned and trained, or the network under the
head; models/yolo.py builds it and models/head.py, utils/assigner.py and utils/loss.py carry the settings. All were
measured on BCCD against 11n (bench/RESULTS.md "NMS-free on BCCD"; network times are ONNX Runtime's at 640 px). The
one to use is the first, 11n-d32-stable (docs/yolo26.md); the rest are the steps towards it and the probes that
did not pay, kept so that the commands beside their figures still run.
"""

from typing import NamedTuple

from utils.assigner import DualAssignment


class Variant(NamedTuple):
    """What an NMS-free variant changes: its box branch, how its one-to-one head trains, or (scale) the network under
    YOLO26's head. The defaults are 26n's."""

    scale: str = "26n"  # the model whose network it keeps (11n: YOLO11n's, with YOLO26's NMS-free head)
    bins: int = 1  # box bins per side: 1, no DFL (26n's); 16, DFL (11n's); 0: the family's
    box_width: int = 16  # the box branch's hidden width: 16 is 26n's, 64 11n's; 0: the usual rule (models/head.py)
    depthwise_box: bool = False  # the box branch's 3x3 convs depthwise, each followed by a 1x1 (YOLO11's class branch)
    joint: bool = False  # the one-to-one head's loss trains the network too (Ultralytics detaches its features)
    one2one_bins: int = 0  # the one-to-one head's own box bins (its branch then has the usual width); 0: `bins`
    peak: bool = False  # the one-to-one class branch sees its features' 3x3 local maxima (models/head.py PeakConv)
    assignment: DualAssignment = DualAssignment()  # how the loss picks each branch's positives (utils/assigner.py)


# The "-d32" box branch, DFL at half 11n's width (32), with the one-to-one loss training the network too ("joint")
D32 = dict(bins=16, box_width=32, joint=True)
LEVEL = DualAssignment(level_strides=8)  # "-level": each object's one-to-one positive on the level its size picks
STABLE = LEVEL._replace(one2one_alignment=(1.0, 2.0))  # "-stable": that positive chosen by score * IoU ** 2

VARIANTS = {
    # The one to use: 11n-d32-level whose one-to-one positive is chosen by score * IoU ** 2, not score ** 0.5 *
    # IoU ** 6, so that it moves between neighbouring anchors less often as their boxes change and their scores need
    # not share the object. 0.581 against 11n's 0.594 over 5 seeds (0.587 against 0.596 over 3), at 0.90x 11n's time.
    "11n-d32-stable": Variant("11n", **D32, assignment=STABLE),
    # The same on 11n-level's narrow head: 0.578 against 11n-level's 0.572 (3 seeds; 0.576 over 5), 0.85x 11n's time
    "11n-stable": Variant("11n", joint=True, assignment=STABLE),
    # Its neighbours, seed 0: led more by the score (score * IoU) 0.573, less (score * IoU ** 3) 0.583
    "11n-d32-stable1": Variant("11n", **D32, assignment=STABLE._replace(one2one_alignment=(1.0, 1.0))),
    "11n-d32-stable3": Variant("11n", **D32, assignment=STABLE._replace(one2one_alignment=(1.0, 3.0))),
    # Its one-to-one head on detached features, the network trained by the one-to-many loss alone: 0.551 at seed 0
    # (with --o2m-final 0.8)
    "11n-d32-stable-det": Variant("11n", bins=16, box_width=32, assignment=STABLE),
    # Both heads' positives chosen by score * IoU ** 2: the one-to-one positive is then the one-to-many head's best
    # (YOLOv10's consistent matching metric, at the one-to-one head's setting): 0.566 at seed 0
    "11n-d32-stable-both": Variant("11n", **D32, assignment=STABLE._replace(one2many_alignment=(1.0, 2.0))),
    # With 11n's own 64-wide DFL box branch (past the time budget): 0.573 at seed 0, so width is not what it lacks
    "11n-w64-stable": Variant("11n", bins=16, box_width=64, joint=True, assignment=STABLE),
    # 11n-stable's exported head (16 wide, no DFL) trained beside 11n's whole one-to-many head (64-wide DFL box
    # branch), which runs only in training and for --nms (26n-aux's idea): 0.572 against 11n-stable's 0.580 at seed 0
    "11n-aux-stable": Variant("11n", bins=16, box_width=64, joint=True, one2one_bins=1, assignment=STABLE),
    # 11n-d32-stable whose one-to-one positive lies on the finest level the object spans fewer than 4 strides of, not 8:
    # BCCD's red cells (44-59 px at 320) at stride 16, about 3 anchors across instead of 6. 0.572 against 0.587 at
    # seed 0, the red cells level (0.566 / 0.565)
    "11n-d32-stable-l4": Variant("11n", **D32, assignment=STABLE._replace(level_strides=4)),
    # 26n-level / 26n-d32-level (below) on YOLO11n's network, whose neck without YOLO26's C3k blocks and attention
    # costs less time in ONNX Runtime than 26n's narrow box branch saves
    "11n-level": Variant("11n", joint=True, assignment=LEVEL),
    "11n-d32-level": Variant("11n", **D32, assignment=LEVEL),
    # 11n-d32-level whose one-to-one positive is the anchor nearest the object's centre, not the best aligned: the
    # same anchor every step, but 0.556 against 0.581 at seed 0 (red cells 0.525 against 0.562)
    "11n-d32-centre": Variant("11n", **D32, assignment=LEVEL._replace(nearest=True)),
    # 11n-level / 11n-d32-level whose one-to-one class branch compares each anchor with its neighbours (PeakConv):
    # 0.574 / 0.572 against 11n-d32-level's 0.575 (2 seeds, on a GPU)
    "11n-peak": Variant("11n", joint=True, peak=True, assignment=LEVEL),
    "11n-d32-peak": Variant("11n", **D32, peak=True, assignment=LEVEL),
    # On YOLO26n's network
    "26n-d32": Variant(bins=16, box_width=32),  # DFL at half 11n's width, 0.95x 11n's network time
    "26n-d32-joint": Variant(**D32),  # the same network and speed, trained jointly
    "26n-joint": Variant(joint=True),  # 26n itself, trained jointly
    # DFL at 24 / 16 channels, trained jointly: 0.95x / 0.94x 11n's mAP on BCCD
    "26n-d24-joint": Variant(bins=16, box_width=24, joint=True),
    "26n-d16-joint": Variant(bins=16, joint=True),
    # 26n-joint whose one-to-one anchors the one-to-many head's predictions pick: NMS-free 0.462 against 0.556
    "26n-cm": Variant(joint=True, assignment=DualAssignment(consistent=True)),
    # 26n's network and answer, trained jointly beside a one-to-many head with 11n's DFL box branch, which runs
    # only in training and for --nms: the NMS-free answer costs what 26n's does (and scores as 26n-joint's)
    "26n-aux": Variant(bins=16, box_width=64, joint=True, one2one_bins=1),
    "26n-d16": Variant(bins=16),  # DFL at 26n's width
    "26n-dw": Variant(bins=16, box_width=64, depthwise_box=True),  # DFL at 11n's width, depthwise
    "26n-b64": Variant(box_width=64),  # 11n's width without DFL
    # 26n-joint / 26n-d32-joint whose one-to-one head detects each object at the one level its size picks
    # (utils/assigner.py level_by_size): no duplicates of one object on two levels
    "26n-level": Variant(joint=True, assignment=LEVEL),
    "26n-d32-level": Variant(**D32, assignment=LEVEL),
    # 26n-dw, the same: 0.570 at seed 0 against 26n-d32-level's 0.585, at 26n-level's speed
    "26n-dw-level": Variant(bins=16, box_width=64, depthwise_box=True, joint=True, assignment=LEVEL),
}
