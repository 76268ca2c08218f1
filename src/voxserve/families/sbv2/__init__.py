"""Style-Bert-VITS2 (issue 20): the synthesizer (model.py), its checkpoint loader (loader.py)
and the BERT shared component (bert.py).

Not registered as a family yet: the text front end and the voice come later (docs/sbv2.md says
what is built).
"""
