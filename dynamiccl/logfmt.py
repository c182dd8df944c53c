"""``--log-format text|json`` for every command: JSON is one object per line (``ts`` in UTC ISO 8601,
``level``, ``logger``, ``msg``, and ``exc`` with the traceback when there is one), for log shippers.

>>> import io
>>> out = io.StringIO(); log = logging.getLogger("demo.x"); h = logging.StreamHandler(out)
>>> h.setFormatter(JsonFormatter()); log.addHandler(h); log.propagate = False
>>> log.warning("port %d in use", 9464)
>>> rec = json.loads(out.getvalue()); (rec["level"], rec["logger"], rec["msg"])
('WARNING', 'demo.x', 'port 9464 in use')
"""
from __future__ import annotations

import json
import logging
from datetime import datetime, timezone

__all__ = ["FORMATS", "JsonFormatter", "configure"]

FORMATS = ("text", "json")
_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {"ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
               "level": record.levelname, "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def configure(level: str, fmt: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(_TEXT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
