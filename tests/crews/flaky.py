"""The one registry, until a ``break-registry`` file appears in the evidence directory: from then on importing
this fails, as a registry whose dependency vanished would (seen by cold-spawned workers). Apart because its
import fails by design."""

import os

if os.path.exists(os.path.join(os.environ.get("CREW_TEST_EVIDENCE_DIR", "/nonexistent"), "break-registry")):
    raise ImportError("a module the registry needs is gone")

from tests.crews import registry

__all__ = ["registry"]
