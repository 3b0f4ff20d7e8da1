"""The method, each phase written once against an Artifact and a DebugSession.

- :func:`reproduce` (and Classify): run the artifact under capture, fold the runs into a verdict.
- :func:`isolate`: probes under the recorded classification turn it into root-cause findings.
- :func:`plan_fix`: one change for the current finding, checked against the boundaries.
- :func:`verify`: the current code and the approved fix, across seeds, judged on the defining
  signal beyond the seed noise.
"""

from .fix import FixRefused, plan_fix
from .isolate import isolate
from .reproduce import Interrupted, reproduce
from .verify import verify

__all__ = ["FixRefused", "Interrupted", "isolate", "plan_fix", "reproduce", "verify"]
