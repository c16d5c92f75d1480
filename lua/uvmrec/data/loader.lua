-- placeholder until the loader lands
return {}
