"""Example services: `orders` (producer, outbox) and `inventory` (consumer, ConsumerApp)."""
