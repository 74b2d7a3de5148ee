"""Tools and prompts that need them, for the real-model tool-call tests and the benchmark
that counts how often a model calls a tool on its own (tool_choice "auto")."""

from __future__ import annotations

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city.",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                       "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "convert_currency", "description": "Convert an amount of money from one currency to another.",
        "parameters": {"type": "object",
                       "properties": {"amount": {"type": "number"},
                                      "from": {"type": "string", "pattern": "^[A-Z]{3}$"},
                                      "to": {"type": "string", "pattern": "^[A-Z]{3}$"}},
                       "required": ["amount", "from", "to"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "search_web", "description": "Search the web and return the top results.",
        "parameters": {"type": "object",
                       "properties": {"query": {"type": "string"},
                                      "max_results": {"type": "integer", "minimum": 1, "maximum": 10}},
                       "required": ["query"], "additionalProperties": False}}},
]

NEEDS_A_TOOL = [
    "What's the weather in Paris?",
    "Is it raining in Tokyo right now?",
    "How warm is it in Cairo today, in fahrenheit?",
    "Tell me the current temperature in Oslo.",
    "What is the weather like in Buenos Aires?",
    "Should I take an umbrella in London today?",
    "Convert 100 US dollars to euros.",
    "How many Japanese yen is 50 GBP?",
    "What is 250 EUR in Swiss francs?",
    "Change 1200 CAD into USD for me.",
    "Search the web for the latest Python release notes.",
    "Find recent news about the James Webb telescope.",
    "Look up who won the 2022 football World Cup.",
    "Search for a good recipe for banana bread.",
    "Find the top 3 results for 'trio structured concurrency'.",
    "What's the weather in Sydney and in Melbourne?",
    "I'm flying to Berlin tomorrow. What's the weather there now?",
    "How much is 75 Australian dollars in New Zealand dollars?",
    "Search online for the population of Iceland.",
    "What's the temperature in New York in celsius?",
]
"""Twenty requests a tool answers (weather, currency, search); the first ten are the
forced-call prompts."""
