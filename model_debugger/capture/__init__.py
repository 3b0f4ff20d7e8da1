"""Capture: the Recorder and its framework instruments."""

from .recorder import CaptureConfig, Recorder, active_recorder, log

__all__ = ["CaptureConfig", "Recorder", "active_recorder", "log"]
