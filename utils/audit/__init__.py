"""The label audit of audit.py: folds (the K-fold predictions), score (the issues), page (issues.csv and
index.html), corrections (the suggested fixes in the dataset's own format)."""
