-- Items bought per customer and orders counted, once per order event
-- (the README's orders walk-through). Events:
-- {"meta":{"event_id":"ord-1"},"customer":{"id":"c-1"},"items":[{"sku":"apple","qty":3}]}
-- Run with handler=script, script.fields=/customer/id,/items,
-- envelope.identity=value:/meta/event_id.
function effect(rec)
  local customer, items = rec.fields['/customer/id'], rec.fields['/items']
  if type(customer) ~= 'string' or type(items) ~= 'table' then
    return false, 'customer.id and items are required'
  end
  local qty = 0
  for _, item in ipairs(items) do
    qty = qty + item.qty
  end
  idem.hincrby('shop:items', customer, qty)
  idem.incrby('shop:orders', 1)
end
