"""The hyperparameters: the one table of learning-rate, loss and augmentation defaults. train.py turns each into a
flag (--lr0 0.02, --close-mosaic 5); the tests and bench/ read the same table, so an edit here is what every run,
test and benchmark then uses. A dataset yaml's `defaults:` and a resumed run's arguments can override a value
(train.py says which, at start and in args.yaml)."""

HYP = dict(
    optimizer="auto",  # sgd | adamw | musgd (YOLO26's) | auto = adamw for runs under 10k iterations, sgd otherwise
    lr0=0.0,  # initial learning rate; 0 = the optimizer's usual value (sgd 0.01, adamw 0.002)
    lrf=0.01,  # final learning rate = lr0 * lrf
    schedule="linear",  # linear | cosine decay after warmup
    momentum=0.937,  # SGD momentum / AdamW beta1
    weight_decay=5e-4,  # scaled by (batch * accumulate / nominal_batch)
    warmup_epochs=3.0,  # at least 100 iterations
    warmup_momentum=0.8,
    warmup_bias_lr=0.1,  # biases start high and come down, with adamw too (RESULTS: ablation); fine-tuning adamw: 0.01
    nominal_batch=0,  # gradients are accumulated until a step has seen this many images; 0: 64, adamw one batch
    accumulate_warmup=1,  # accumulation ramps from 1 micro-batch to the full count over the warmup (0: off)
    clip_grad=10.0,  # max gradient norm
    box=7.5, cls=0.5, dfl=1.5,  # loss gains
    # --teacher's class-score distillation: --cls's gain, so that the class scores' gradient is half the labels', half
    # the teacher's (the KL term's gradient is the BCE's against the teacher's scores). Reasoned, not yet measured.
    distill_gain=0.5,
    cls_weights="",  # per-class weights of the class term: auto (inverse frequency in the train labels) | w1,w2,...
    o2m_final=0.1,  # YOLO26 ProgLoss: one-to-many loss weight in the last epoch (0.8 in the first; 0.8 = constant)
    tiny_box=8.5,  # assigner: box sides under this count as this long when picking anchors (8.5: one stride-8 centre)
    hsv_h=0.015, hsv_s=0.7, hsv_v=0.4,  # augmentation: HSV jitter fractions
    degrees=0.0, translate=0.1, scale=0.5, shear=0.0,  # affine: rotation deg, shift fraction, scale gain, shear deg
    flipud=0.0, fliplr=0.5, mosaic=1.0,  # probabilities
    mosaic_min_area=0.1,  # a box the mosaic cuts to under this fraction of its area is dropped (0: only empty ones)
    mixup=0.0,
    close_mosaic=10,  # no mosaic in the last N epochs: finish on images that look like test images
    ema_decay=0.9999, ema_tau=2000,  # EMA decay ramps up over ~tau updates
    ema_floor=0.0,  # the EMA averages at least the last ~1 / (1 - ema_floor) updates (a long fine-tuning run: 0.9)
)  # fmt: skip
