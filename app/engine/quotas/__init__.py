"""Limits that keep one tenant from starving the others or running up the bill: request
and turn rates per key, running runs per tenant, token budgets per tenant and session.
All of them are held in the database, so every replica enforces the same figures."""
