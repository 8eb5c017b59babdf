"""Runnable demonstrations (``python -m triflux demo NAME``): :mod:`.unet`
segments generated images (:mod:`.shapes`) or volumes (:mod:`.volumes`),
:mod:`.mlp` classifies scikit-learn's handwritten digits."""
