"""The one lock that orders every read-modify-write of device-wide L2 state in this process (the
set-aside limit, the granularity probe, the persist scopes).

A Python lock: CUDA calls made under it release the GIL, and no C++ lock is ever taken while it is held.
"""

from __future__ import annotations

import threading

lock = threading.RLock()
