-- Stock per SKU, changed exactly once per inventory event.
-- Events: {"event":{"id":"evt-1"},"sku":"apple","qty":10}; qty > 0 adds
-- stock, qty < 0 takes it. Run with handler=script,
-- script.file=inventory.lua, script.fields=/sku,/qty,
-- envelope.identity=value:/event/id.
local STOCK = 'inventory:stock'

function effect(rec)
  local sku, qty = rec.fields['/sku'], rec.fields['/qty']
  if type(sku) ~= 'string' or sku == '' then
    return false, 'sku: missing'
  end
  if type(qty) ~= 'number' or qty ~= math.floor(qty) or qty == 0 then
    return false, 'qty: must be a whole number other than 0'
  end
  -- idem.hget: the stock in Redis plus this chunk's accepted events
  local have = idem.hget(STOCK, sku) or 0
  if have + qty < 0 then
    return false, 'out of stock: ' .. sku .. ' has ' .. have ..
      ', the event takes ' .. -qty
  end
  idem.hincrby(STOCK, sku, qty)
end
