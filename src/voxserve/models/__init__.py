"""Model layers that more than one family builds on (modules and dims dataclasses only): the
VITS layers of Piper and Style-Bert-VITS2 (vits.py) and their precision policy
(vits_precision.py). A family imports these, never another family's folder."""
