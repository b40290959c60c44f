"""The data path, in the order a run uses it: dataset_yaml (what a yaml names) -> voc / coco_json / YOLO txt
(annotations: what the formats share) -> labels (verification and the label cache) -> records (the verified split
as flat arrays) -> images (reading, --cache ram) -> augment (mosaic, affine, HSV, flip, letterbox on uint8) ->
loader (the datasets, the sampler, the DataLoader and its workers). shapes generates the built-in set."""
