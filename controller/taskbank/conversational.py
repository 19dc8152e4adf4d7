"""The built-in conversational task set "conversational-v1": a simulated user, mock services.

Three services, written as data (controller/contracts/services.py), as a task author would:

- `shop` (retail): users and orders; find a user by name and zip, read, cancel or re-address a
  pending order, request a return of a delivered one;
- `airline`: reservations and flights; read, add bags (at most 3), change to another flight on
  the same route with seats left, cancel;
- `mail` and `calendar` (assistant): an inbox and sent mail; events to create, move or delete.

Each task: the operator's instruction (the agent's policy, ending with a unique ticket line),
a template user (persona, goal, hidden facts, replies, stop conditions), the reference calls
(hidden `reference.json`: what an agent that does the job calls, and what it says last) and a
`state` checker whose goal is the initial state with the reference calls replayed by the rule
engine (`controller.contracts.serviceengine.replay`): the goal cannot drift from the rules.
Some tasks have a goal equal to the initial state: the right answer is to refuse (a delivered
order cannot be cancelled), checked by what the agent tells the user: a refusal must say a fact
only the look-up gives ("already delivered", "already has 2 bags"), so a blind refusal (nothing
looked up) fails; `reference_reasons` tries blind refusals against every task. Every task has an LLM
judge (`node:judge`, the node's judge service; weight 0.2) reading the conversation; the local
run's scripted judge cannot grade the rubric of `retail/new-address-tone`, so its passing
rollouts end `judge_failed` (never 0, never trained on).

Pure data, no I/O. Must not import: zmq, sqlite3, nodeagent.
"""
from __future__ import annotations

import copy
import json
import re

from controller.contracts.serviceengine import RuleError, replay
from controller.contracts.services import compare_state, operation_names
from controller.contracts.tasks import Budgets, Task, TaskSet

TASKSET_NAME = "conversational-v1"
REFERENCE_FILE = "reference.json"
STOP_WORDS = ["all set", "cannot", "can't", "is done", "has been", "is now", "are now"]


def _get(*path):
    return {"get": list(path)}


def _arg(name):
    return {"arg": name}


def _str(**extra):
    return {"type": "object", "additionalProperties": False, "required": sorted(extra),
            "properties": {k: v for k, v in extra.items()}}


S = {"type": "string", "minLength": 1}

SHOP = {
    "description": "An online shop's users and orders.",
    "state_schema": {"type": "object", "required": ["users", "orders"], "properties": {
        "users": {"type": "object", "additionalProperties": {"type": "object", "required": ["name", "zip"]}},
        "orders": {"type": "object", "additionalProperties": {
            "type": "object", "required": ["user", "status", "items", "address"],
            "properties": {"status": {"enum": ["pending", "delivered", "cancelled", "return_requested"]}}}}}},
    "initial_state": {
        "users": {"u1": {"name": "Ada Byron", "zip": "10115", "email": "ada@example.org"},
                  "u2": {"name": "Alan Turing", "zip": "94110", "email": "alan@example.org"},
                  "u3": {"name": "Grace Hopper", "zip": "02139", "email": "grace@example.org"}},
        "orders": {
            "W1001": {"user": "u1", "status": "pending", "address": "1 Unter den Linden, Berlin",
                      "items": [{"sku": "lamp-01", "price": 40}, {"sku": "bulb-06", "price": 5}]},
            "W1002": {"user": "u2", "status": "pending", "address": "5 Mission St, San Francisco",
                      "items": [{"sku": "desk-02", "price": 250}]},
            "W1003": {"user": "u3", "status": "delivered", "address": "77 Mass Ave, Cambridge",
                      "items": [{"sku": "chair-07", "price": 120}, {"sku": "mat-03", "price": 30}]},
            "W1004": {"user": "u1", "status": "delivered", "address": "1 Unter den Linden, Berlin",
                      "items": [{"sku": "kettle-04", "price": 35}]},
            "W1005": {"user": "u2", "status": "pending", "address": "5 Mission St, San Francisco",
                      "items": [{"sku": "pen-09", "price": 3}, {"sku": "ink-10", "price": 7}]}}},
    "operations": {
        "find_user": {
            "description": "Find a customer's user id by full name and zip code.",
            "parameters": _str(name=S, zip=S),
            "steps": [
                      {"require": {"gt": [{"len": {"filter": {"from": _get("users"), "where": {
                          "name": _arg("name"), "zip": _arg("zip")}}}}, 0]},
                       "error": "no user with that name and zip code"},
                      {"return": {"object": {"matches": {"filter": {"from": _get("users"), "where": {
                          "name": _arg("name"), "zip": _arg("zip")}}}}}}]},
        "get_order": {
            "description": "Read an order by its id (e.g. W1001).",
            "parameters": _str(order_id=S),
            "steps": [{"require": {"exists": ["orders", _arg("order_id")]}, "error": "no such order"},
                      {"return": _get("orders", _arg("order_id"))}]},
        "cancel_order": {
            "description": "Cancel a pending order. reason: 'no longer needed' or 'ordered by mistake'.",
            "parameters": _str(order_id=S, reason={"enum": ["no longer needed", "ordered by mistake"]}),
            "steps": [{"require": {"exists": ["orders", _arg("order_id")]}, "error": "no such order"},
                      {"require": {"eq": [_get("orders", _arg("order_id"), "status"), "pending"]},
                       "error": "only pending orders can be cancelled"},
                      {"set": [["orders", _arg("order_id"), "status"], "cancelled"]},
                      {"set": [["orders", _arg("order_id"), "cancel_reason"], _arg("reason")]},
                      {"return": {"object": {"order_id": _arg("order_id"), "status": "cancelled"}}}]},
        "update_address": {
            "description": "Change the shipping address of a pending order.",
            "parameters": _str(order_id=S, address=S),
            "steps": [{"require": {"exists": ["orders", _arg("order_id")]}, "error": "no such order"},
                      {"require": {"eq": [_get("orders", _arg("order_id"), "status"), "pending"]},
                       "error": "only pending orders can be changed"},
                      {"set": [["orders", _arg("order_id"), "address"], _arg("address")]},
                      {"return": {"object": {"order_id": _arg("order_id"), "address": _arg("address")}}}]},
        "request_return": {
            "description": "Request the return of items (by sku) of a delivered order.",
            "parameters": _str(order_id=S, skus={"type": "array", "minItems": 1, "items": S}),
            "steps": [{"require": {"exists": ["orders", _arg("order_id")]}, "error": "no such order"},
                      {"require": {"eq": [_get("orders", _arg("order_id"), "status"), "delivered"]},
                       "error": "only delivered orders can be returned"},
                      {"set": [["orders", _arg("order_id"), "status"], "return_requested"]},
                      {"set": [["orders", _arg("order_id"), "return_skus"], _arg("skus")]},
                      {"return": {"object": {"order_id": _arg("order_id"), "status": "return_requested"}}}]},
    },
}

AIRLINE = {
    "description": "An airline's flights and reservations.",
    "state_schema": {"type": "object", "required": ["flights", "reservations"], "properties": {
        "flights": {"type": "object", "additionalProperties": {
            "type": "object", "required": ["origin", "dest", "date", "seats_left"],
            "properties": {"seats_left": {"type": "integer", "minimum": 0}}}},
        "reservations": {"type": "object", "additionalProperties": {
            "type": "object", "required": ["passenger", "flight", "bags", "status"],
            "properties": {"bags": {"type": "integer", "minimum": 0, "maximum": 3},
                           "status": {"enum": ["active", "cancelled"]}}}}}},
    "initial_state": {
        "flights": {"PA100": {"origin": "JFK", "dest": "SFO", "date": "2026-05-01", "seats_left": 3},
                    "PA102": {"origin": "JFK", "dest": "SFO", "date": "2026-05-03", "seats_left": 1},
                    "PA104": {"origin": "JFK", "dest": "SFO", "date": "2026-05-04", "seats_left": 0},
                    "PA200": {"origin": "BOS", "dest": "ORD", "date": "2026-06-10", "seats_left": 5}},
        "reservations": {"R2001": {"passenger": "Mia Chen", "flight": "PA100", "bags": 1, "status": "active"},
                         "R2002": {"passenger": "Omar Diaz", "flight": "PA100", "bags": 0, "status": "active"},
                         "R2003": {"passenger": "Lena Park", "flight": "PA200", "bags": 2, "status": "active"}}},
    "operations": {
        "get_reservation": {
            "description": "Read a reservation by id (e.g. R2001).",
            "parameters": _str(reservation_id=S),
            "steps": [{"require": {"exists": ["reservations", _arg("reservation_id")]}, "error": "no such reservation"},
                      {"return": _get("reservations", _arg("reservation_id"))}]},
        "search_flights": {
            "description": "List the flights from origin to dest (airport codes).",
            "parameters": _str(origin=S, dest=S),
            "steps": [{"return": {"object": {"flights": {"keys": _get("flights")}, "matching": {"filter": {
                "from": _get("flights"), "where": {"origin": _arg("origin"), "dest": _arg("dest")}}}}}}]},
        "add_bags": {
            "description": "Add checked bags to an active reservation (at most 3 in total).",
            "parameters": _str(reservation_id=S, count={"type": "integer", "minimum": 1, "maximum": 3}),
            "steps": [{"require": {"exists": ["reservations", _arg("reservation_id")]}, "error": "no such reservation"},
                      {"require": {"eq": [_get("reservations", _arg("reservation_id"), "status"), "active"]},
                       "error": "the reservation is not active"},
                      {"let": {"bags": {"add": [_get("reservations", _arg("reservation_id"), "bags"), _arg("count")]}}},
                      {"require": {"le": [{"var": "bags"}, 3]}, "error": "at most 3 bags per reservation"},
                      {"set": [["reservations", _arg("reservation_id"), "bags"], {"var": "bags"}]},
                      {"return": {"object": {"reservation_id": _arg("reservation_id"), "bags": {"var": "bags"}}}}]},
        "change_flight": {
            "description": "Move an active reservation to another flight on the same route with seats left.",
            "parameters": _str(reservation_id=S, flight_id=S),
            "steps": [{"require": {"exists": ["reservations", _arg("reservation_id")]}, "error": "no such reservation"},
                      {"require": {"exists": ["flights", _arg("flight_id")]}, "error": "no such flight"},
                      {"let": {"old": _get("reservations", _arg("reservation_id"), "flight")}},
                      {"require": {"and": [
                          {"eq": [_get("flights", {"var": "old"}, "origin"), _get("flights", _arg("flight_id"), "origin")]},
                          {"eq": [_get("flights", {"var": "old"}, "dest"), _get("flights", _arg("flight_id"), "dest")]}]},
                       "error": "the new flight must fly the same route"},
                      {"require": {"gt": [_get("flights", _arg("flight_id"), "seats_left"), 0]},
                       "error": "that flight is full"},
                      {"set": [["flights", _arg("flight_id"), "seats_left"],
                               {"sub": [_get("flights", _arg("flight_id"), "seats_left"), 1]}]},
                      {"set": [["flights", {"var": "old"}, "seats_left"],
                               {"add": [_get("flights", {"var": "old"}, "seats_left"), 1]}]},
                      {"set": [["reservations", _arg("reservation_id"), "flight"], _arg("flight_id")]},
                      {"return": {"object": {"reservation_id": _arg("reservation_id"), "flight": _arg("flight_id")}}}]},
        "cancel_reservation": {
            "description": "Cancel an active reservation.",
            "parameters": _str(reservation_id=S),
            "steps": [{"require": {"exists": ["reservations", _arg("reservation_id")]}, "error": "no such reservation"},
                      {"require": {"eq": [_get("reservations", _arg("reservation_id"), "status"), "active"]},
                       "error": "the reservation is not active"},
                      {"set": [["reservations", _arg("reservation_id"), "status"], "cancelled"]},
                      {"return": {"object": {"reservation_id": _arg("reservation_id"), "status": "cancelled"}}}]},
    },
}

MAIL = {
    "description": "A mailbox: inbox and sent mail.",
    "state_schema": {"type": "object", "required": ["inbox", "sent"], "properties": {
        "inbox": {"type": "object"}, "sent": {"type": "array", "items": {
            "type": "object", "required": ["to", "subject", "body"]}}}},
    "initial_state": {
        "inbox": {"m1": {"from": "bob@example.org", "subject": "Budget review",
                         "body": "Can we meet next week about the budget?"},
                  "m2": {"from": "carol@example.org", "subject": "Offsite venue",
                         "body": "Which venue did we pick for the offsite?"}},
        "sent": []},
    "operations": {
        "list_inbox": {"description": "List the inbox (message ids, senders, subjects).",
                       "parameters": {"type": "object", "additionalProperties": False, "properties": {}},
                       "steps": [{"return": _get("inbox")}]},
        "send_email": {
            "description": "Send an email.",
            "parameters": _str(to=S, subject=S, body=S),
            "steps": [{"append": [["sent"], {"object": {"to": _arg("to"), "subject": _arg("subject"),
                                                        "body": _arg("body")}}]},
                      {"return": {"object": {"sent": True, "count": {"len": _get("sent")}}}}]},
    },
}

CALENDAR = {
    "description": "A calendar of events.",
    "state_schema": {"type": "object", "required": ["events"], "properties": {"events": {
        "type": "object", "additionalProperties": {
            "type": "object", "required": ["title", "date", "start", "end"],
            "properties": {"date": {"type": "string", "pattern": "^\\d{4}-\\d{2}-\\d{2}$"},
                           "start": {"type": "string", "pattern": "^\\d{2}:\\d{2}$"},
                           "end": {"type": "string", "pattern": "^\\d{2}:\\d{2}$"}}}}}},
    "initial_state": {"events": {
        "E1": {"title": "Team sync", "date": "2026-03-02", "start": "10:00", "end": "10:30", "attendees": ["bob"]},
        "E2": {"title": "Dentist", "date": "2026-03-03", "start": "15:00", "end": "16:00", "attendees": []}}},
    "operations": {
        "list_events": {"description": "List events on a date (YYYY-MM-DD).",
                        "parameters": _str(date=S),
                        "steps": [{"return": {"filter": {"from": _get("events"), "where": {"date": _arg("date")}}}}]},
        "create_event": {
            "description": "Create an event; returns its id.",
            "parameters": _str(title=S, date=S, start=S, end=S,
                               attendees={"type": "array", "items": S}),
            "steps": [{"require": {"lt": [_arg("start"), _arg("end")]}, "error": "start must be before end"},
                      {"let": {"id": {"concat": ["E", {"add": [{"len": _get("events")}, 1]}]}}},
                      {"set": [["events", {"var": "id"}], {"object": {
                          "title": _arg("title"), "date": _arg("date"), "start": _arg("start"), "end": _arg("end"),
                          "attendees": _arg("attendees")}}]},
                      {"return": {"object": {"event_id": {"var": "id"}}}}]},
        "move_event": {
            "description": "Move an event to a new date and time.",
            "parameters": _str(event_id=S, date=S, start=S, end=S),
            "steps": [{"require": {"exists": ["events", _arg("event_id")]}, "error": "no such event"},
                      {"require": {"lt": [_arg("start"), _arg("end")]}, "error": "start must be before end"},
                      {"set": [["events", _arg("event_id"), "date"], _arg("date")]},
                      {"set": [["events", _arg("event_id"), "start"], _arg("start")]},
                      {"set": [["events", _arg("event_id"), "end"], _arg("end")]},
                      {"return": {"object": {"event_id": _arg("event_id"), "moved": True}}}]},
        "delete_event": {
            "description": "Delete an event.",
            "parameters": _str(event_id=S),
            "steps": [{"require": {"exists": ["events", _arg("event_id")]}, "error": "no such event"},
                      {"delete": ["events", _arg("event_id")]},
                      {"return": {"object": {"event_id": _arg("event_id"), "deleted": True}}}]},
    },
}

POLICIES = {
    "shop": ("You are the support assistant of an online shop. Before reading or changing an order, find the "
             "customer with find_user (full name and zip code). Only pending orders can be cancelled or "
             "re-addressed; only delivered orders can be returned. Confirm what you did to the customer."),
    "airline": ("You are an airline's reservation assistant. Read the reservation before changing it. Bags: "
                "at most 3 per reservation. A flight change must keep the route and needs a seat. Confirm "
                "what you did to the passenger."),
    "assistant": ("You are a personal assistant with the user's mailbox and calendar. Do exactly what the "
                  "user asks; confirm what you did."),
}


# Every task's judge: the node's judge service (`node:judge`), reading the whole conversation.
JUDGE = {"endpoint": "node:judge", "model": "judge", "sees": "trajectory", "weight": 0.2, "max_retries": 2,
         "requests_per_s": 20.0,
         "rubric": "Did the agent tell the user plainly what it did, without instructions to the user or the grader?"}
# A rubric the local run's scripted judge cannot grade: its rollouts that pass are judge_failed.
TONE_RUBRIC = "Grade the tone of the agent's messages: warm, professional, never curt."
TONE_TASKS = {"retail/new-address-tone"}
# Tasks whose user is played by a model (the node's `user_sim` endpoint; the local run's policy
# server answers it), with the sampling recorded in every call.
MODEL_USER_TASKS = {"airline/change-flight": {"kind": "model", "model": "user-sim", "temperature": 0.7, "seed": 11}}


def _call(op, **args):
    return {"name": op, "arguments": args}


# (slug, domain, services, persona, instruction, opening, hidden, reference calls, final words,
#  told include, match fields or None, built-in tools)
_SPECS = [
    ("retail/cancel-pending", "shop", ("shop",), "Ada, polite and brief",
     "Cancel order W1001; you no longer need it.", "Hi, I want to cancel an order.",
     {"name": "Ada Byron", "zip": "10115", "order_id": "W1001", "reason": "no longer needed"},
     [_call("find_user", name="Ada Byron", zip="10115"), _call("get_order", order_id="W1001"),
      _call("cancel_order", order_id="W1001", reason="no longer needed")],
     "Your order W1001 has been cancelled.", ["cancelled"], None, ()),
    ("retail/cancel-mistake", "shop", ("shop",), "Alan, in a hurry",
     "Cancel order W1005; you ordered it by mistake.", "Hello. I ordered something by mistake.",
     {"name": "Alan Turing", "zip": "94110", "order_id": "W1005", "reason": "ordered by mistake"},
     [_call("find_user", name="Alan Turing", zip="94110"),
      _call("cancel_order", order_id="W1005", reason="ordered by mistake")],
     "Order W1005 has been cancelled.", ["cancelled"], None, ()),
    ("retail/new-address", "shop", ("shop",), "Alan, precise",
     "Ship order W1002 to 9 Valencia St, San Francisco instead.", "I need to change a shipping address.",
     {"name": "Alan Turing", "zip": "94110", "order_id": "W1002", "address": "9 Valencia St, San Francisco"},
     [_call("find_user", name="Alan Turing", zip="94110"),
      _call("update_address", order_id="W1002", address="9 Valencia St, San Francisco")],
     "Order W1002 will now ship to 9 Valencia St, San Francisco.", ["9 Valencia St"], None, ()),
    ("retail/new-address-tone", "shop", ("shop",), "Alan, particular about manners",
     "Ship order W1005 to 12 Castro St, San Francisco instead.", "Good day. A shipping address needs changing.",
     {"name": "Alan Turing", "zip": "94110", "order_id": "W1005", "address": "12 Castro St, San Francisco"},
     [_call("find_user", name="Alan Turing", zip="94110"),
      _call("update_address", order_id="W1005", address="12 Castro St, San Francisco")],
     "Order W1005 will now ship to 12 Castro St, San Francisco.", ["12 Castro St"], None, ()),
    ("retail/return-chair", "shop", ("shop",), "Grace, friendly",
     "Return the chair (chair-07) of order W1003; keep the mat.", "Hi! I'd like to return something.",
     {"name": "Grace Hopper", "zip": "02139", "order_id": "W1003", "sku": "chair-07"},
     [_call("find_user", name="Grace Hopper", zip="02139"), _call("get_order", order_id="W1003"),
      _call("request_return", order_id="W1003", skus=["chair-07"])],
     "The return of chair-07 from order W1003 has been requested.", ["return"], None, ()),
    ("retail/refuse-delivered", "shop", ("shop",), "Ada, insistent",
     "Cancel order W1004 (it was delivered; you want it cancelled anyway).", "Please cancel my kettle order.",
     {"name": "Ada Byron", "zip": "10115", "order_id": "W1004", "reason": "no longer needed"},
     [_call("find_user", name="Ada Byron", zip="10115"), _call("get_order", order_id="W1004")],
     "I'm sorry, order W1004 was already delivered, so I cannot cancel it; you can request a return.",
     ["cannot", "already delivered"], None, ()),
    ("airline/add-bag", "airline", ("airline",), "Mia, traveling with family",
     "Add one checked bag to reservation R2001.", "Hi, can I add a bag to my booking?",
     {"name": "Mia Chen", "reservation_id": "R2001", "count": "1"},
     [_call("get_reservation", reservation_id="R2001"), _call("add_bags", reservation_id="R2001", count=1)],
     "Reservation R2001 now has 2 bags.", ["2 bags"], None, ()),
    ("airline/change-flight", "airline", ("airline",), "Omar, flexible on dates",
     "Move reservation R2002 (JFK to SFO) to a later flight with seats; May 3 is fine.",
     "I need to fly later than planned.",
     {"name": "Omar Diaz", "reservation_id": "R2002", "date": "May 3"},
     [_call("get_reservation", reservation_id="R2002"), _call("search_flights", origin="JFK", dest="SFO"),
      _call("change_flight", reservation_id="R2002", flight_id="PA102")],
     "Your reservation R2002 is now on flight PA102 on 2026-05-03.", ["PA102"], None, ()),
    ("airline/cancel", "airline", ("airline",), "Lena, plans changed",
     "Cancel reservation R2003.", "My plans changed; I need to cancel my trip.",
     {"name": "Lena Park", "reservation_id": "R2003"},
     [_call("get_reservation", reservation_id="R2003"), _call("cancel_reservation", reservation_id="R2003")],
     "Reservation R2003 has been cancelled.", ["cancelled"], None, ()),
    ("airline/refuse-bags", "airline", ("airline",), "Lena, packing heavy",
     "Add two more bags to reservation R2003 (it has 2; the limit is 3).", "Can I add two bags?",
     {"name": "Lena Park", "reservation_id": "R2003", "count": "2"},
     [_call("get_reservation", reservation_id="R2003")],
     "Sorry, R2003 already has 2 bags and the limit is 3, so I cannot add two more.",
     ["cannot", "already has 2 bags"], None, ()),
    ("assistant/schedule", "assistant", ("mail", "calendar"), "Sam, busy manager",
     "Schedule 'Budget review' with bob on 2026-03-05 from 14:00 to 15:00, then email bob@example.org "
     "with subject 'Budget review' to confirm.", "Please set up the budget review Bob asked about.",
     {"date": "2026-03-05", "start": "14:00", "end": "15:00", "email": "bob@example.org"},
     [_call("list_inbox"),
      _call("create_event", title="Budget review", date="2026-03-05", start="14:00", end="15:00", attendees=["bob"]),
      _call("send_email", to="bob@example.org", subject="Budget review",
            body="Booked: budget review on 2026-03-05, 14:00-15:00.")],
     "The budget review is booked (2026-03-05, 14:00) and Bob has been emailed.", ["booked"],
     ["/calendar/events", "/mail/sent/0/to", "/mail/sent/0/subject"], ("shell",)),
    ("assistant/move-sync", "assistant", ("mail", "calendar"), "Sam, rearranging the week",
     "Move 'Team sync' (E1) to 2026-03-04, 11:00-11:30.", "Can you move my team sync?",
     {"event_id": "E1", "date": "2026-03-04", "start": "11:00", "end": "11:30"},
     [_call("list_events", date="2026-03-02"),
      _call("move_event", event_id="E1", date="2026-03-04", start="11:00", end="11:30")],
     "Team sync is now on 2026-03-04 at 11:00.", ["11:00"], None, ("shell",)),
    ("assistant/reply-venue", "assistant", ("mail", "calendar"), "Sam, organising the offsite",
     "Reply to carol@example.org (subject 'Re: Offsite venue') that the venue is the Lakeside Hall, and "
     "delete the Dentist appointment (E2).", "Two things: answer Carol about the venue, and drop my dentist visit.",
     {"email": "carol@example.org", "venue": "Lakeside Hall", "event_id": "E2"},
     [_call("list_inbox"),
      _call("send_email", to="carol@example.org", subject="Re: Offsite venue", body="The venue is the Lakeside Hall."),
      _call("delete_event", event_id="E2")],
     "Carol has been told it's the Lakeside Hall, and the dentist appointment is deleted.", ["Lakeside Hall"],
     ["/calendar/events", "/mail/sent/0/to", "/mail/sent/0/subject"], ("shell",)),
]

_SERVICES = {"shop": SHOP, "airline": AIRLINE, "mail": MAIL, "calendar": CALENDAR}


def _replies(hidden: dict) -> list[dict]:
    facts = ", ".join(f"{k.replace('_', ' ')}: {{{k}}}" for k in hidden)
    return [{"when": r"\?", "say": f"Sure. {facts}."}]


# A refusal task's look-up fact is one of a few values a policy could guess: a refusal that
# lists them all (no call made) must fail, so the words that name the other values are excluded.
REFUSAL_SIBLINGS = {
    "retail/refuse-delivered": ["shipped", "processing", "pending", "in transit", "not yet delivered",
                                "not delivered", "cancelled already"],
    "airline/refuse-bags": ["has 0 bags", "has 1 bag", "has 3 bags", "has 4 bags", "has 5 bags", "no bags"],
}
STATUS_WORDS = ("delivered", "shipped", "processing", "pending", "in transit", "cancelled", "returned")


def _task(spec) -> Task:
    (slug, domain, names, persona, goal_text, opening, hidden, calls, final, told, fields, tools) = spec
    services = {n: copy.deepcopy(_SERVICES[n]) for n in names}
    owner = {op: n for n in names for op in services[n]["operations"]}
    goal = {n: copy.deepcopy(services[n]["initial_state"]) for n in names}
    for n in names:
        goal[n] = replay(services[n], goal[n], [(c["name"], c["arguments"]) for c in calls if owner[c["name"]] == n])
    said = {"include": told, **({"exclude": REFUSAL_SIBLINGS[slug]} if slug in REFUSAL_SIBLINGS else {})}
    checker = {"kind": "state", "goal": goal, "told": said,
               "judge": {**JUDGE, "rubric": TONE_RUBRIC} if slug in TONE_TASKS else dict(JUDGE)}
    if fields:
        checker.update(match="fields", fields=fields)
    user = {"kind": "template", "persona": persona, "instruction": goal_text, "hidden": hidden,
            "opening": opening, "replies": _replies(hidden),
            "fallback": "Is it done?", "stop": {"max_turns": 6, "when_agent_says": STOP_WORDS},
            **MODEL_USER_TASKS.get(slug, {})}
    instruction = f"{POLICIES[domain]}\n\nTicket: {slug}."
    reference = {"calls": calls, "final": final}
    return Task(name=f"conversational/{slug}", family="conversational", instruction=instruction,
                hidden={REFERENCE_FILE: json.dumps(reference, indent=1, sort_keys=True)}, checker=checker,
                budgets=Budgets(max_steps=16, wall_s=120.0), services=services, user=user, tools=tools)


def conversational_tasks() -> list[Task]:
    return [_task(s) for s in _SPECS]


def conversational_taskset() -> TaskSet:
    return TaskSet(TASKSET_NAME, tuple(conversational_tasks()))


def reference_reasons(task: Task) -> list[str]:
    """Why a conversational task is broken (empty: it is sound): its reference calls
    (hidden `reference.json`) must run under the rules and, with its final words, meet the
    goal; the null conversation (nothing done, nothing said), a bare claim (the final words
    with nothing done, where the goal needs a change) and a blind refusal (nothing looked up:
    `blind_refusals`, built from what the agent knows without a look-up) must not."""
    if task.checker.get("kind") != "state":
        return []
    try:
        ref = json.loads(task.hidden[REFERENCE_FILE])
    except (KeyError, ValueError) as exc:
        return [f"no reference ({REFERENCE_FILE}): {exc}"]
    owner = operation_names(task.services)
    initial = {n: copy.deepcopy(s["initial_state"]) for n, s in task.services.items()}
    final = dict(initial)
    try:
        for n in task.services:
            final[n] = replay(task.services[n], initial[n],
                              [(c["name"], c["arguments"]) for c in ref["calls"] if owner.get(c["name"]) == n])
    except (RuleError, KeyError, TypeError) as exc:
        return [f"reference calls do not run: {exc}"]
    reasons = []

    def met(state, told):
        return all(ok for _, ok, _ in compare_state(task.checker, state, told))
    if not met(final, [ref.get("final", "")]):
        bad = [f"{n}: {d}" for n, ok, d in compare_state(task.checker, final, [ref.get("final", "")]) if not ok]
        reasons.append(f"reference solution does not pass: {'; '.join(bad)[:300]}")
    if met(initial, []):
        reasons.append("null solution (nothing done, nothing said) meets the goal")
    if final != initial and met(initial, [ref.get("final", "")]):
        reasons.append("hack:claim_success (the final words, nothing done) meets the goal")
    for said in blind_refusals(task):
        if met(initial, [said]):
            reasons.append(f"hack:blind_refusal (nothing looked up) meets the goal: {said[:120]!r}")
            break
    return reasons


def blind_refusals(task: Task) -> list[str]:
    """Refusals an agent can write without looking anything up: generic ones, and one that
    repeats everything it knows without a service call (its instruction, the user's opening and
    every fact the user gives when asked)."""
    user = task.user or {}
    facts = " ".join(str(v) for v in (user.get("hidden") or {}).values())
    generic = ["Sorry, I cannot do that.", "I'm sorry, but I can't do that; it cannot be done, all set.",
               "That is not possible: I cannot change it. Nothing has been done."]
    knows = f"Sorry, I cannot do that. {user.get('opening', '')} {facts} {task.instruction}"
    return generic + [knows, _shotgun(task)]


def _shotgun(task: Task) -> str:
    """A refusal naming every value a look-up could have given: each required phrase with its
    numbers run through 0-5, and the usual status words (the s11b red team's no-look-up refusal)."""
    told = (task.checker.get("told") or {}).get("include") or []
    guesses = [re.sub(r"\d+", str(n), phrase) for phrase in told for n in range(6)]
    guesses += [re.sub(r"\d+ bags?", f"{n} bag" + ("" if n == 1 else "s"), phrase)
                for phrase in told for n in range(6)]
    return ("Sorry, I cannot do that: " + "; ".join(dict.fromkeys(guesses)) + "; it is already "
            + ", already ".join(STATUS_WORDS) + ".")


def validate_conversational(taskset: TaskSet, names: list[str]) -> tuple[list[str], dict]:
    """(the names that are sound, {name: {task_id, reasons}} of the others) among `names`."""
    by_name = taskset.by_name()
    ok, bad = [], {}
    for name in names:
        reasons = reference_reasons(by_name[name])
        if reasons:
            bad[name] = {"task_id": by_name[name].task_id, "reasons": reasons}
        else:
            ok.append(name)
    return ok, bad


__all__ = ["REFERENCE_FILE", "TASKSET_NAME", "blind_refusals", "conversational_tasks", "conversational_taskset",
           "reference_reasons", "validate_conversational"]
