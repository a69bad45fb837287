"""Column types shared by the models."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Any

from sqlalchemy import BigInteger, DateTime, Integer, Text, func
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import mapped_column

CreatedAt = Annotated[dt.datetime, mapped_column(DateTime(timezone=True), server_default=func.now())]
UuidPk = Annotated[uuid.UUID, mapped_column(UUID(as_uuid=True), primary_key=True)]
UuidCol = Annotated[uuid.UUID, mapped_column(UUID(as_uuid=True))]
BigInt = Annotated[int, mapped_column(BigInteger)]
Int = Annotated[int, mapped_column(Integer)]
Str = Annotated[str, mapped_column(Text)]
Json = Annotated[Any, mapped_column(JSONB)]


def utcnow() -> dt.datetime:
    """Now, as an aware UTC datetime."""
    return dt.datetime.now(dt.UTC)
