"""Export formats: formats (the one table: flags, file names, options, packages), writers (how each format is
written), loaders (how each is opened for val.py, detect.py and predict)."""
