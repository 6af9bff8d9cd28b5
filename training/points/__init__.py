"""The book's models on points (sequences of feature vectors): models, reference decode, data sets and trainer."""
