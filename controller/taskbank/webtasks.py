"""The built-in web tasks: the "shop" app family (`nodeagent/browser/apps/shop.py`), 22 tasks.

Every task starts from the same shop (`SEED_SQL`, the task's hidden `seed.sql`): customers alice
and bob, an admin, eight products, two coupons, and three orders (alice's #1 placed, #2
shipped; bob's #3 placed). The instruction names the user and password to log in with and one
goal; the checker (`webstate`) reads the final database and pages (docs/tasks.md, "Writing a
web task"). Each task also checks that nothing else changed that the goal does not need (no
stray order, no other user's data), so a policy that clicks everything does not pass.

Templates: cart (put N of a product in the cart, no order), buy (order N of a product to an
address, optionally with a coupon), cancel (an order), review (rating and text), wishlist,
account (display name; email and newsletter). `web_taskset()` is the set `builtin-web-v1`.
Must not import: zmq, nodeagent.
"""
from __future__ import annotations

from controller.contracts.browser_tools import BROWSER_TOOLS
from controller.contracts.tasks import Budgets, Limits, Task, TaskSet

TASKSET_NAME = "builtin-web-v1"
IMAGE = "builtin:browser"
ORIGIN = "http://127.0.0.1:8080"
PRODUCTS = [(1, "Blue Mug", 1250, 10, "kitchen"), (2, "Red Kettle", 3999, 3, "kitchen"),
            (3, "Oak Cutting Board", 2400, 5, "kitchen"), (4, "Wool Scarf", 1999, 8, "clothing"),
            (5, "Rain Jacket", 8900, 2, "clothing"), (6, "Desk Lamp", 3450, 6, "home"),
            (7, "Linen Pillow", 2750, 4, "home"), (8, "Trail Map", 899, 20, "books")]
PID = {name: pid for pid, name, *_ in PRODUCTS}
USERS = {"alice": (1, "alice-pw"), "bob": (2, "bob-pw")}


def _q(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


SEED_SQL = "\n".join(
    ["INSERT INTO users VALUES (1,'alice','alice-pw','Alice','alice@example.com','customer',0,'1 Main St');",
     "INSERT INTO users VALUES (2,'bob','bob-pw','Bob','bob@example.com','customer',1,'9 Hill Rd');",
     "INSERT INTO users VALUES (3,'admin','adm-7f3c1e9b2a','Admin','admin@example.com','admin',0,'');"]
    + [f"INSERT INTO products VALUES ({p},{_q(n)},{c},{s},{_q(cat)},{_q('A fine ' + n.lower() + '.')});"
       for p, n, c, s, cat in PRODUCTS]
    + ["INSERT INTO coupons VALUES ('SAVE10',10);", "INSERT INTO coupons VALUES ('HALF',50);",
       "INSERT INTO orders VALUES (1,1,'placed',1250,'1 Main St','');",
       "INSERT INTO order_items VALUES (1,1,1,1250);",
       "INSERT INTO orders VALUES (2,1,'shipped',899,'1 Main St','');",
       "INSERT INTO order_items VALUES (2,8,1,899);",
       "INSERT INTO orders VALUES (3,2,'placed',3999,'9 Hill Rd','');",
       "INSERT INTO order_items VALUES (3,2,1,3999);"]) + "\n"
ORDER_COUNT = 3
# chromium's processes and profile: memory, pids and open files well above the python tasks'
LIMITS = Limits(memory_mb=1536, pids=512, disk_mb=256, nofile=2048)


def _login(user: str) -> str:
    return f"Log in to the shop at {ORIGIN} as {user} (password {USERS[user][1]})."


def _no_new_orders() -> dict:
    return {"name": "no new orders", "sql": "SELECT COUNT(*) FROM orders", "expect": [[ORDER_COUNT]]}


def _task(slug: str, user: str, goal: str, checks: list[dict]) -> Task:
    return Task(name=f"web/shop-{slug}", family="web", image=IMAGE,
                instruction=f"{_login(user)} Then {goal}",
                hidden={"seed.sql": SEED_SQL}, checker={"kind": "webstate", "app": "shop", "checks": checks},
                tools=BROWSER_TOOLS, budgets=Budgets(max_steps=24, wall_s=240.0), limits=LIMITS)


def cart_task(user: str, product: str, qty: int) -> Task:
    uid = USERS[user][0]
    return _task(f"cart-{user}-{PID[product]}-{qty}", user,
                 f"put {qty} × {product} in your cart, without placing an order.",
                 [{"name": "cart", "sql": f"SELECT product_id, qty FROM cart WHERE user_id={uid}",
                   "expect": [[PID[product], qty]]}, _no_new_orders()])


def buy_task(user: str, product: str, qty: int, address: str, coupon: str = "") -> Task:
    uid = USERS[user][0]
    pct = {"": 0, "SAVE10": 10, "HALF": 50}[coupon]
    price = next(c for p, n, c, *_ in PRODUCTS if n == product)
    goal = f'buy {qty} × {product}, shipped to "{address}"' + (f", with the coupon code {coupon}." if coupon else ".")
    return _task(f"buy-{user}-{PID[product]}-{qty}{'-' + coupon.lower() if coupon else ''}", user, goal, [
        {"name": "the new order", "sql": f"SELECT o.status, o.address, o.coupon, o.total_cents, i.product_id, i.qty "
                                         f"FROM orders o JOIN order_items i ON i.order_id = o.id "
                                         f"WHERE o.id > {ORDER_COUNT} ORDER BY o.id",
         "expect": [["placed", address, coupon, qty * price * (100 - pct) // 100, PID[product], qty]]},
        {"name": "ordered by the user", "sql": f"SELECT user_id FROM orders WHERE id > {ORDER_COUNT}",
         "expect": [[uid]]}])


def cancel_task(user: str, order: int) -> Task:
    others = [o for o in (1, 2, 3) if o != order]
    return _task(f"cancel-{user}-{order}", user, f"cancel your order #{order}.", [
        {"name": "order cancelled", "sql": f"SELECT status FROM orders WHERE id={order}", "expect": [["cancelled"]]},
        {"name": "other orders untouched", "sql": f"SELECT id, status FROM orders WHERE id IN {tuple(others)} ORDER BY id",
         "expect": [[o, {1: "placed", 2: "shipped", 3: "placed"}[o]] for o in others]},
        {"name": "order page", "page": f"/order/{order}", "as": user, "password": USERS[user][1],
         "element": "order-status", "expect": "cancelled"},
        _no_new_orders()])


def review_task(user: str, product: str, rating: int, text: str) -> Task:
    uid = USERS[user][0]
    return _task(f"review-{user}-{PID[product]}-{rating}", user,
                 f'post a review of {product} with a rating of {rating} and the text "{text}".',
                 [{"name": "review", "sql": f"SELECT product_id, rating, body FROM reviews WHERE user_id={uid}",
                   "expect": [[PID[product], rating, text]]}])


def wishlist_task(user: str, product: str) -> Task:
    uid = USERS[user][0]
    return _task(f"wishlist-{user}-{PID[product]}", user, f"add {product} to your wishlist.",
                 [{"name": "wishlist", "sql": f"SELECT product_id FROM wishlist WHERE user_id={uid}",
                   "expect": [[PID[product]]]}, _no_new_orders()])


def name_task(user: str, name: str) -> Task:
    uid = USERS[user][0]
    email = {"alice": "alice@example.com", "bob": "bob@example.com"}[user]
    news = {"alice": 0, "bob": 1}[user]
    return _task(f"name-{user}-{name.split()[0].lower()}", user, f'change your display name to "{name}".',
                 [{"name": "account", "sql": f"SELECT display_name, email, newsletter FROM users WHERE id={uid}",
                   "expect": [[name, email, news]]}])


def email_task(user: str, email: str) -> Task:
    uid = USERS[user][0]
    display = {"alice": "Alice", "bob": "Bob"}[user]
    return _task(f"email-{user}", user, f'change your email to "{email}" and subscribe to the newsletter.',
                 [{"name": "account", "sql": f"SELECT display_name, email, newsletter FROM users WHERE id={uid}",
                   "expect": [[display, email, 1]]}])


def web_tasks() -> tuple[Task, ...]:
    return (
        cart_task("alice", "Red Kettle", 2), cart_task("alice", "Trail Map", 5), cart_task("bob", "Wool Scarf", 1),
        cart_task("bob", "Desk Lamp", 3),
        buy_task("alice", "Blue Mug", 2, "12 Harbour Lane"), buy_task("bob", "Linen Pillow", 1, "77 Station Road"),
        buy_task("alice", "Desk Lamp", 1, "4 Orchard Way", "SAVE10"), buy_task("bob", "Trail Map", 4, "9 Hill Rd", "HALF"),
        buy_task("alice", "Oak Cutting Board", 2, "1 Main St"),
        cancel_task("alice", 1), cancel_task("bob", 3),
        review_task("alice", "Rain Jacket", 4, "Kept me dry all week"), review_task("bob", "Blue Mug", 5, "Perfect size"),
        review_task("alice", "Wool Scarf", 2, "Itchy"), review_task("bob", "Oak Cutting Board", 3, "Fine"),
        wishlist_task("alice", "Rain Jacket"), wishlist_task("bob", "Linen Pillow"), wishlist_task("alice", "Desk Lamp"),
        name_task("alice", "Alice Liddell"), name_task("bob", "Robert Jones"),
        email_task("alice", "alice@wonder.example"), email_task("bob", "bob@builder.example"),
    )


def web_taskset() -> TaskSet:
    return TaskSet(name=TASKSET_NAME, tasks=web_tasks())


__all__ = ["SEED_SQL", "TASKSET_NAME", "web_taskset", "web_tasks"]
