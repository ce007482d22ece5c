"""The HTTP side: the app, its three routers (contract, operator, metrics' scrape), bearer auth, declared answers."""
