"""The tuner config file's format constants, shared by the writer (the retuner) and both parsers
(``dynamiccl/nccl_tuner_plugin/config.py`` and the C plugin's ``src/rules.c`` / ``src/internal.h``)."""
from __future__ import annotations

from dynamiccl.contracts.runtime_paths import default_tuner_config

__all__ = ["ENV_VAR", "DEFAULT_PATH", "MAX_RULES", "MAX_VERSIONS", "MAX_FILE_BYTES", "MAX_LINE_CHARS",
           "MAX_CHANNELS", "U64_MAX", "HEADER", "TRAILER_PREFIX", "TRAILER_FORMAT"]

ENV_VAR = "DYNAMICCL_TUNER_CONFIG"        # where the plugin reads and the retuner writes
DEFAULT_PATH = default_tuner_config()     # per user and job, from this process's environment (runtime_paths)
MAX_RULES = 256                           # per version: the C plugin's fixed table size
MAX_VERSIONS = 8                          # versions kept in one file
MAX_FILE_BYTES = 1 << 20
MAX_LINE_CHARS = 1023                     # non-comment characters per line
MAX_CHANNELS = 64                         # NCCL's MAXCHANNELS
U64_MAX = (1 << 64) - 1
HEADER = "# dynamiccl tuner config format=2"   # format 2: the file must end with TRAILER
#: last line of a format-2 file: ``# end lines=K crc32=XXXXXXXX`` — K lines before it, CRC-32 (zlib's) of
#: every byte before it. A file cut short (truncate-then-crash, a write torn at a line boundary) lacks it
#: and is refused: the reader keeps the version it has. Files without the format-2 header (format 1,
#: hand-written) need no trailer.
TRAILER_PREFIX = "# end "
TRAILER_FORMAT = "# end lines={lines} crc32={crc:08x}"
