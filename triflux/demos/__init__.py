"""Runnable demonstrations (``python -m triflux demo NAME``)."""
