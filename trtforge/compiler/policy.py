"""Moved to :mod:`trtforge.core.policy`."""

from trtforge._compat import moved

moved(__name__, "trtforge.core.policy")
