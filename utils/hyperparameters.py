"""The hyperparameters: one table of the learning-rate, loss and augmentation settings, each with its --help text,
and the two tables of what `auto` becomes. train.py turns each HYP entry into a flag (--lr0 auto, --close-mosaic 5);
tests and bench/ read DEFAULTS, the plain values. A dataset yaml's `defaults:` and a resumed run's
arguments can override a value, and train.py prints each value that is not --help's with its source."""

HYP = dict(
    optimizer=("auto", "sgd | adamw | musgd (YOLO26's) | auto: adamw for runs under 10,000 iterations, else sgd"),
    lr0=("auto", "initial learning rate; auto: SGD and MuSGD 0.01, AdamW 0.002, or the fine-tuning table below"),
    lrf=(0.01, "final learning rate = lr0 * lrf"),
    schedule=("linear", "linear | cosine decay after the warmup"),
    momentum=("auto", "SGD momentum / AdamW beta1; auto: 0.937, or the fine-tuning table below"),
    weight_decay=(5e-4, "weight decay at nominal_batch images a step, scaled to the images a step sees"),
    warmup_epochs=(3.0, "warmup length in epochs, at least 100 iterations (0: no warmup)"),
    warmup_momentum=(0.8, "momentum at the start of the warmup, rising to --momentum"),
    warmup_bias_lr=("auto", "biases' learning rate at the start of the warmup, falling to lr0; auto: 0.1, or the "
                    "fine-tuning table below"),
    nominal_batch=("auto", "images an optimizer step sees (gradients accumulate until then); auto: 64, for AdamW "
                   "one batch, or the fine-tuning table below"),
    accumulate_warmup=(1, "1: accumulation ramps from 1 micro-batch to the full count over the warmup; 0: off"),
    clip_grad=(10.0, "largest gradient norm a step takes"),
    box=(7.5, "loss gain of the box term"),
    cls=(0.5, "loss gain of the class term"),
    dfl=(1.5, "loss gain of the distribution focal loss term"),
    distill_gain=(0.5, "--teacher: gain of its class-score term, so that labels and teacher weigh alike"),
    cls_weights=("", "per-class weights of the class term: auto (inverse frequency in the train labels) | w1,w2,..."),
    o2m_final=(0.1, "YOLO26 ProgLoss: one-to-many loss weight in the last epoch, falling from 0.8 (0.8: constant)"),
    tiny_box=(8.5, "assigner: box sides under this count as this long when picking anchors (one stride-8 centre)"),
    hsv_h=(0.015, "hue jitter, a fraction of the hue circle"),
    hsv_s=(0.7, "saturation jitter, a fraction"),
    hsv_v=(0.4, "brightness jitter, a fraction"),
    degrees=(0.0, "random rotation, degrees"),
    translate=(0.1, "random shift, a fraction of the image size"),
    scale=(0.5, "random scale gain"),
    shear=(0.0, "random shear, degrees"),
    flipud=(0.0, "probability of an up-down flip"),
    fliplr=(0.5, "probability of a left-right flip"),
    mosaic=(1.0, "probability of a four-image mosaic"),
    mosaic_min_area=(0.1, "a box the mosaic cuts to under this fraction of its area is dropped (0: only empty ones)"),
    mixup=(0.0, "probability of mixing in a second mosaic"),
    close_mosaic=(10, "no mosaic in the last N epochs: finish on images that look like test images"),
    ema_decay=(0.9999, "the EMA's decay, reached as it ramps up over about --ema-tau updates"),
    ema_tau=(2000, "updates over which the EMA's decay ramps up"),
    ema_floor=("auto", "the EMA averages at least about the last 1 / (1 - ema_floor) updates; auto: 0 (off), or the "
               "fine-tuning table below"),
)  # fmt: skip
DEFAULTS = {key: value for key, (value, _) in HYP.items()}  # the plain values, as tests and bench/ read them

# iterations: --optimizer auto picks AdamW for shorter runs, SGD from here (as Ultralytics' auto)
AUTO_ADAMW_UNDER = 10_000
# What `auto` becomes from scratch (and with --weights --scratch-recipe), by optimizer: YOLOv5's and YOLO26's values,
# but AdamW steps after every batch (nominal_batch None), as its short runs have few steps to spare
# (docs/training.md#why-the-defaults-are-what-they-are).
SCRATCH = dict(
    sgd=dict(lr0=0.01, nominal_batch=64, warmup_bias_lr=0.1, momentum=0.937, ema_floor=0.0),
    musgd=dict(lr0=0.01, nominal_batch=64, warmup_bias_lr=0.1, momentum=0.937, ema_floor=0.0),
    adamw=dict(lr0=0.002, nominal_batch=None, warmup_bias_lr=0.1, momentum=0.937, ema_floor=0.0),
)  # fmt: skip
# The fine-tuning table: what `auto` becomes in an AdamW run from --weights, over SCRATCH's adamw row, by the run's n
# iterations against its w warmup iterations; the first row that holds (evidence:
# bench/RESULTS.md#fine-tuning-without-forgetting-measured-not-solved). A value set by flag or yaml stays as set.
FINE_TUNING = (
    ("{n} iterations, under 1.5x the {w}-iteration warmup", lambda n, w: n < 1.5 * w,
     dict(lr0=0.002, warmup_bias_lr=0.01),
     "such a run lies mostly in its warmup, under lr0; biases from 0.1 would move the pretrained ones far"),
    ("{n} iterations, 1.5x the {w}-iteration warmup or more", lambda n, w: True,
     dict(lr0=0.00143, nominal_batch=64, warmup_bias_lr=0.0, momentum=0.9, ema_floor=0.9),
     "a step per batch tore such runs down mid-run; Ultralytics' AdamW settings and a short EMA do not"),
)  # fmt: skip
LEGACY_AUTO = ("lr0", "nominal_batch")  # 0 meant auto before the word did: old last.pt files and commands keep it


def is_auto(key, value):
    """Whether `value` of setting `key` asks the run to choose it."""
    return value == "auto" or (key in LEGACY_AUTO and value == 0)


def number_or_auto(kind):
    """An argparse type: the word auto, or a number of `kind` (--lr0 auto, or the rate itself)."""

    def parse(text):
        return "auto" if text == "auto" else kind(text)

    parse.__name__ = f"{kind.__name__} or auto"  # argparse's error: "invalid float or auto value: 'x'"
    return parse


def flag_type(key):
    """The type of --KEY: its default's; a number or the word for an `auto` one (--optimizer: a name)."""
    value = HYP[key][0]
    if value != "auto" or key == "optimizer":
        return type(value)
    return number_or_auto(int if key == "nominal_batch" else float)
