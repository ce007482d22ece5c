"""The module's launcher for the shared ``server`` (``tests/helpers/launchers.py``)."""

from tests.helpers.launchers import crew_supervisor_settings, launcher, pytest_generate_tests

__all__ = ["crew_supervisor_settings", "launcher", "pytest_generate_tests"]
