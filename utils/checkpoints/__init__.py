"""Reading and writing weights files: ours (our .pt: atomic save, weights_only load, the training state),
ultralytics (an Ultralytics .pt converted to our layout), safe_unpickle (the restricted unpickler that reads it
without running anything from it). models/weights.py builds the network from what these return."""
