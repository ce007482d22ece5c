"""The mutation check's breaks still apply to the source (scripts/mutants.py): a refactor that moved the code
a mutant breaks must move the mutant too, or the check would silently break nothing."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))  # scripts/ is not a package
import mutants


@pytest.mark.parametrize("mutant", mutants.MUTANTS, ids=lambda m: m.name)
def test_each_mutant_applies_exactly_once_and_names_tests_that_exist(mutant: mutants.Mutant) -> None:
    assert mutants.applies(mutant), f"{mutant.name}: its text is not in {mutant.path} exactly once"
    for test in mutant.tests:
        path, _, name = test.partition("::")
        assert (ROOT / path).is_file() and f"def {name.split('[')[0]}(" in (ROOT / path).read_text(), test
