"""Shared pytest fixtures. Each area keeps its fixtures in tests/_fixtures_<area>.py and is imported here."""
from _fixtures_runtime import *  # noqa: F401,F403
from _fixtures_adb import *  # noqa: F401,F403
from _fixtures_analysis import *  # noqa: F401,F403
from _fixtures_farm import *  # noqa: F401,F403
from _fixtures_services import *  # noqa: F401,F403
from _fixtures_emulator import *  # noqa: F401,F403
from _fixtures_browser import *  # noqa: F401,F403
from _fixtures_s3 import *  # noqa: F401,F403
