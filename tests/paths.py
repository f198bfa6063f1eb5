"""Where things are, for tests in any folder: the repository, the tests folder, the fixtures."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
FIXTURES = TESTS / "fixtures"
