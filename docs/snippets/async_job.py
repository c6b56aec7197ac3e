"""``async def`` jobs work too; the lock's statements run in Django's sync thread."""

import asyncio

from django_exclusive_jobs import exclusive_job


@exclusive_job("warm_caches", every="10m", ttl="2m")
async def warm_caches() -> int:
    pages = ["/", "/pricing/", "/docs/"]
    await asyncio.gather(*(asyncio.sleep(0) for _ in pages))  # fetch them concurrently
    return len(pages)
