"""Token models (ids in, ids out): what every token model offers (base), the recurrent and transformer families,
text data sets and the trainer."""
