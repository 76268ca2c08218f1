"""Style-Bert-VITS2 (issue 20): the synthesizer (model.py) and its checkpoint loader (loader.py).

Not registered as a family yet: the text front end and the shared BERT stage come later
(docs/sbv2.md says what is built).
"""
