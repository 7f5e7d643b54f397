"""surecall.dispatch: validate, authorize, claim an idempotency key, execute, record."""
