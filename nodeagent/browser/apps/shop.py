"""The "shop" web app of web tasks, and its state evaluator. Runs INSIDE a sandbox.

Shipped into the sandbox as one file and run by the image's python3 (standard library only:
http.server + sqlite3). Two modes:

  python3 shop.py serve CONFIG   serve http://127.0.0.1:PORT over the database DB. CONFIG is a
                                 JSON file {db, port, key_hex, seed_sql?}: read, then deleted
                                 (the audit key then lives only in this process).
  python3 shop.py evaluate       stdin: {db, key_hex, checks, port?}; stdout: one JSON verdict.

Every change the app makes goes through `mutate`: one transaction that applies the change
and appends an `audit` row (seq, actor, action, params, the digest of every domain table after
the change, and an HMAC-SHA256 chained over the previous row's). The evaluator refuses a
database whose audit chain does not verify under the key, or whose domain tables do not hash to
the last row's digest (or to the seed's, with no row): an edit made out of band (not through
the app) is "tampered", never graded. Pages escape every user string (html.escape), so a
review or a display name cannot forge an element the evaluator reads.

Users: `alice` (customer, password `alice-pw`), `bob` (customer, `bob-pw`), `admin` (role
admin, a password the agent is never told). /admin/* answers 403 to anyone but an admin.
Standard library only: it runs in the task's image.
"""
from __future__ import annotations

import hashlib
import hmac
import html
import http.server
import json
import os
import re
import secrets
import sqlite3
import sys
import threading
import urllib.parse
import urllib.request

SCHEMA = """
CREATE TABLE IF NOT EXISTS users (id INTEGER PRIMARY KEY, username TEXT UNIQUE NOT NULL, password TEXT NOT NULL,
  display_name TEXT NOT NULL, email TEXT NOT NULL, role TEXT NOT NULL DEFAULT 'customer',
  newsletter INTEGER NOT NULL DEFAULT 0, address TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, price_cents INTEGER NOT NULL,
  stock INTEGER NOT NULL, category TEXT NOT NULL, description TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS cart (user_id INTEGER NOT NULL, product_id INTEGER NOT NULL, qty INTEGER NOT NULL,
  PRIMARY KEY (user_id, product_id));
CREATE TABLE IF NOT EXISTS wishlist (user_id INTEGER NOT NULL, product_id INTEGER NOT NULL,
  PRIMARY KEY (user_id, product_id));
CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL, status TEXT NOT NULL,
  total_cents INTEGER NOT NULL, address TEXT NOT NULL, coupon TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS order_items (order_id INTEGER NOT NULL, product_id INTEGER NOT NULL, qty INTEGER NOT NULL,
  price_cents INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS reviews (id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL, product_id INTEGER NOT NULL,
  rating INTEGER NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS coupons (code TEXT PRIMARY KEY, percent INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS audit (seq INTEGER PRIMARY KEY, actor TEXT NOT NULL, action TEXT NOT NULL,
  params TEXT NOT NULL, digest TEXT NOT NULL, mac TEXT NOT NULL);
"""
DOMAIN_TABLES = ("users", "products", "cart", "wishlist", "orders", "order_items", "reviews", "coupons")
MAX_BODY_BYTES = 64 * 1024
MAX_TEXT = 2000


def state_digest(conn: sqlite3.Connection) -> str:
    """sha256 over every domain table's rows, in primary-key order, as canonical JSON."""
    h = hashlib.sha256()
    for table in DOMAIN_TABLES:
        rows = conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
        h.update(json.dumps([table, [list(r) for r in rows]], separators=(",", ":")).encode())
    return h.hexdigest()


def _mac(key: bytes, prev: str, seq: int, actor: str, action: str, params: str, digest: str) -> str:
    msg = json.dumps([prev, seq, actor, action, params, digest], separators=(",", ":")).encode()
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


def seed_mac(key: bytes, digest: str) -> str:
    return _mac(key, "", 0, "seed", "seed", "{}", digest)


class Shop:
    def __init__(self, db: str, key: bytes) -> None:
        self.db, self.key, self.lock = db, key, threading.Lock()
        self.sessions: dict[str, int] = {}

    def conn(self) -> sqlite3.Connection:
        c = sqlite3.connect(self.db, isolation_level=None, timeout=10)
        c.row_factory = sqlite3.Row
        return c

    def mutate(self, actor: str, action: str, params: dict, fn) -> object:
        """Apply fn(conn) and append the audit row, in one transaction."""
        with self.lock:
            c = self.conn()
            try:
                c.execute("BEGIN IMMEDIATE")
                out = fn(c)
                last = c.execute("SELECT seq, mac FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
                seq, prev = (last["seq"] + 1, last["mac"]) if last else (1, seed_mac(self.key, self.seed_digest))
                p, digest = json.dumps(params, sort_keys=True), state_digest(c)
                c.execute("INSERT INTO audit VALUES (?,?,?,?,?,?)",
                          (seq, actor, action, p, digest, _mac(self.key, prev, seq, actor, action, p, digest)))
                c.execute("COMMIT")
                return out
            except Exception:
                c.execute("ROLLBACK")
                raise
            finally:
                c.close()


# ------------------------------------------------------------------------------ pages

def page(title: str, body: str, user: sqlite3.Row | None) -> bytes:
    who = (f'<span id="whoami">Signed in as {html.escape(user["display_name"])}</span> '
           f'<form method="post" action="/logout" style="display:inline"><button>Log out</button></form>'
           if user else '<a href="/login">Log in</a>')
    nav = ('<nav><a href="/">Home</a> | <a href="/cart">Cart</a> | <a href="/orders">Orders</a> | '
           f'<a href="/wishlist">Wishlist</a> | <a href="/account">Account</a> | {who}</nav>')
    return (f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}</title></head>"
            f"<body>{nav}<main><h1>{html.escape(title)}</h1>{body}</main></body></html>").encode()


def money(cents: int) -> str:
    return f"${cents // 100}.{cents % 100:02d}"


class Handler(http.server.BaseHTTPRequestHandler):
    shop: Shop
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    # -- plumbing
    def _user(self, c):
        cookie = self.headers.get("Cookie", "")
        m = re.search(r"sid=([0-9a-f]{32})", cookie)
        uid = self.shop.sessions.get(m.group(1)) if m else None
        return c.execute("SELECT * FROM users WHERE id=?", (uid,)).fetchone() if uid else None

    def _send(self, status: int, body: bytes, headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, to: str, headers: dict | None = None) -> None:
        self._send(303, b"", {"Location": to, **(headers or {})})

    def _form(self) -> dict:
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY_BYTES:
            raise ValueError("request body too large")
        data = self.rfile.read(n).decode(errors="replace")
        return {k: v[0][:MAX_TEXT] for k, v in urllib.parse.parse_qs(data).items()}

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        path = urllib.parse.urlsplit(self.path).path
        c = self.shop.conn()
        try:
            user = self._user(c)
            form = self._form() if method == "POST" else {}
            for pattern, handler in ROUTES:
                m = re.fullmatch(pattern, f"{method} {path}")
                if m:
                    return handler(self, c, user, form, *m.groups())
            self._send(404, page("Not found", "<p>No such page.</p>", user))
        except ValueError as exc:
            self._send(400, page("Bad request", f"<p>{html.escape(str(exc))}</p>", None))
        finally:
            c.close()

    def _need_user(self, user) -> bool:
        if user is None:
            self._redirect("/login")
            return False
        return True


def _home(h, c, user, form):
    rows = c.execute("SELECT * FROM products ORDER BY id").fetchall()
    items = "".join(f'<li><a href="/product/{r["id"]}">{html.escape(r["name"])}</a> — {money(r["price_cents"])}'
                    f' ({html.escape(r["category"])})</li>' for r in rows)
    h._send(200, page("Paddock Shop", f"<ul>{items}</ul>", user))


def _login_page(h, c, user, form):
    body = ('<form method="post" action="/login"><label>Username <input name="username"></label> '
            '<label>Password <input name="password" type="password"></label> <button>Log in</button></form>')
    h._send(200, page("Log in", body, user))


def _login(h, c, user, form):
    row = c.execute("SELECT * FROM users WHERE username=?", (form.get("username", ""),)).fetchone()
    if row is None or not hmac.compare_digest(row["password"], form.get("password", "")):
        return h._send(200, page("Log in", '<p role="alert">Wrong username or password.</p>'
                                 '<a href="/login">Try again</a>', None))
    sid = secrets.token_hex(16)
    h.shop.sessions[sid] = row["id"]
    h._redirect("/", {"Set-Cookie": f"sid={sid}; Path=/; HttpOnly"})


def _logout(h, c, user, form):
    h._redirect("/", {"Set-Cookie": "sid=; Path=/; Max-Age=0"})


def _product(h, c, user, form, pid):
    r = c.execute("SELECT * FROM products WHERE id=?", (int(pid),)).fetchone()
    if r is None:
        return h._send(404, page("Not found", "<p>No such product.</p>", user))
    revs = c.execute("SELECT reviews.*, users.display_name FROM reviews JOIN users ON users.id=user_id "
                     "WHERE product_id=? ORDER BY reviews.id", (r["id"],)).fetchall()
    rev = "".join(f'<li>{x["rating"]}/5 by {html.escape(x["display_name"])}: {html.escape(x["body"])}</li>'
                  for x in revs) or "<li>No reviews yet.</li>"
    stars = "".join(f'<option value="{i}">{i}</option>' for i in range(1, 6))
    body = (f'<p id="price">{money(r["price_cents"])}</p><p id="stock">In stock: {r["stock"]}</p>'
            f'<p>{html.escape(r["description"])}</p>'
            f'<form method="post" action="/cart/add/{r["id"]}"><label>Quantity <input name="qty" value="1"></label>'
            ' <button>Add to cart</button></form>'
            f'<form method="post" action="/wishlist/add/{r["id"]}"><button>Add to wishlist</button></form>'
            f'<h2>Reviews</h2><ul>{rev}</ul>'
            f'<form method="post" action="/review/{r["id"]}"><label>Rating <select name="rating">{stars}</select></label>'
            ' <label>Review <input name="body"></label> <button>Post review</button></form>')
    h._send(200, page(r["name"], body, user))


def _qty(form) -> int:
    try:
        q = int(form.get("qty", "1"))
    except ValueError:
        raise ValueError("quantity must be a whole number") from None
    if not 1 <= q <= 99:
        raise ValueError("quantity must be between 1 and 99")
    return q


def _cart_add(h, c, user, form, pid):
    if not h._need_user(user):
        return
    q, pid = _qty(form), int(pid)
    if c.execute("SELECT 1 FROM products WHERE id=?", (pid,)).fetchone() is None:
        raise ValueError("no such product")
    h.shop.mutate(user["username"], "cart_add", {"product": pid, "qty": q}, lambda x: x.execute(
        "INSERT INTO cart VALUES (?,?,?) ON CONFLICT(user_id, product_id) DO UPDATE SET qty=qty+excluded.qty",
        (user["id"], pid, q)))
    h._redirect("/cart")


def _cart_total(c, uid: int) -> int:
    return c.execute("SELECT COALESCE(SUM(qty*price_cents),0) FROM cart JOIN products ON id=product_id "
                     "WHERE user_id=?", (uid,)).fetchone()[0]


def _cart(h, c, user, form):
    if not h._need_user(user):
        return
    rows = c.execute("SELECT cart.qty, products.* FROM cart JOIN products ON id=product_id WHERE user_id=? "
                     "ORDER BY id", (user["id"],)).fetchall()
    items = "".join(f'<li>{html.escape(r["name"])} × {r["qty"]} <form method="post" action="/cart/remove/{r["id"]}"'
                    f' style="display:inline"><button>Remove {html.escape(r["name"])}</button></form></li>'
                    for r in rows) or "<li>Your cart is empty.</li>"
    body = (f'<ul>{items}</ul><p id="cart-total">Total: {money(_cart_total(c, user["id"]))}</p>'
            + ('<a href="/checkout">Proceed to checkout</a>' if rows else ""))
    h._send(200, page("Cart", body, user))


def _cart_remove(h, c, user, form, pid):
    if not h._need_user(user):
        return
    h.shop.mutate(user["username"], "cart_remove", {"product": int(pid)}, lambda x: x.execute(
        "DELETE FROM cart WHERE user_id=? AND product_id=?", (user["id"], int(pid))))
    h._redirect("/cart")


def _checkout_page(h, c, user, form):
    if not h._need_user(user):
        return
    body = (f'<p>Total: {money(_cart_total(c, user["id"]))}</p><form method="post" action="/checkout">'
            f'<label>Shipping address <input name="address" value="{html.escape(user["address"], quote=True)}"></label> '
            '<label>Coupon code <input name="coupon"></label> <button>Place order</button></form>')
    h._send(200, page("Checkout", body, user))


def _checkout(h, c, user, form):
    if not h._need_user(user):
        return
    address, code = form.get("address", "").strip(), form.get("coupon", "").strip().upper()

    def place(x):
        items = x.execute("SELECT cart.product_id, cart.qty, products.price_cents, products.stock FROM cart "
                          "JOIN products ON id=product_id WHERE user_id=?", (user["id"],)).fetchall()
        if not items:
            raise ValueError("your cart is empty")
        if not address:
            raise ValueError("a shipping address is required")
        pct = 0
        if code:
            row = x.execute("SELECT percent FROM coupons WHERE code=?", (code,)).fetchone()
            if row is None:
                raise ValueError(f"unknown coupon code {code}")
            pct = row["percent"]
        for it in items:
            if it["qty"] > it["stock"]:
                raise ValueError("not enough stock")
        total = sum(it["qty"] * it["price_cents"] for it in items) * (100 - pct) // 100
        oid = x.execute("INSERT INTO orders (user_id, status, total_cents, address, coupon) VALUES (?,?,?,?,?)",
                        (user["id"], "placed", total, address, code)).lastrowid
        for it in items:
            x.execute("INSERT INTO order_items VALUES (?,?,?,?)", (oid, it["product_id"], it["qty"], it["price_cents"]))
            x.execute("UPDATE products SET stock=stock-? WHERE id=?", (it["qty"], it["product_id"]))
        x.execute("DELETE FROM cart WHERE user_id=?", (user["id"],))
        return oid
    oid = h.shop.mutate(user["username"], "checkout", {"address": address, "coupon": code}, place)
    h._redirect(f"/order/{oid}")


def _orders(h, c, user, form):
    if not h._need_user(user):
        return
    rows = c.execute("SELECT * FROM orders WHERE user_id=? ORDER BY id", (user["id"],)).fetchall()
    items = "".join(f'<li><a href="/order/{r["id"]}">Order #{r["id"]}</a> — {html.escape(r["status"])}'
                    f' — {money(r["total_cents"])}</li>' for r in rows) or "<li>No orders yet.</li>"
    h._send(200, page("Orders", f"<ul>{items}</ul>", user))


def _order(h, c, user, form, oid):
    if not h._need_user(user):
        return
    r = c.execute("SELECT * FROM orders WHERE id=? AND user_id=?", (int(oid), user["id"])).fetchone()
    if r is None:
        return h._send(404, page("Not found", "<p>No such order.</p>", user))
    its = c.execute("SELECT order_items.*, products.name FROM order_items JOIN products ON id=product_id "
                    "WHERE order_id=?", (r["id"],)).fetchall()
    lines = "".join(f'<li>{html.escape(i["name"])} × {i["qty"]}</li>' for i in its)
    cancel = (f'<form method="post" action="/order/{r["id"]}/cancel"><button>Cancel order</button></form>'
              if r["status"] == "placed" else "")
    body = (f'<p>Status: <span id="order-status">{html.escape(r["status"])}</span></p>'
            f'<p id="order-total">Total: {money(r["total_cents"])}</p><p>Ship to: {html.escape(r["address"])}</p>'
            f'<ul>{lines}</ul>{cancel}')
    h._send(200, page(f"Order #{r['id']}", body, user))


def _order_cancel(h, c, user, form, oid):
    if not h._need_user(user):
        return

    def cancel(x):
        r = x.execute("SELECT * FROM orders WHERE id=? AND user_id=?", (int(oid), user["id"])).fetchone()
        if r is None or r["status"] != "placed":
            raise ValueError("this order cannot be cancelled")
        x.execute("UPDATE orders SET status='cancelled' WHERE id=?", (r["id"],))
        for it in x.execute("SELECT * FROM order_items WHERE order_id=?", (r["id"],)).fetchall():
            x.execute("UPDATE products SET stock=stock+? WHERE id=?", (it["qty"], it["product_id"]))
    h.shop.mutate(user["username"], "order_cancel", {"order": int(oid)}, cancel)
    h._redirect(f"/order/{int(oid)}")


def _wishlist(h, c, user, form):
    if not h._need_user(user):
        return
    rows = c.execute("SELECT products.* FROM wishlist JOIN products ON id=product_id WHERE user_id=? ORDER BY id",
                     (user["id"],)).fetchall()
    items = "".join(f'<li>{html.escape(r["name"])}</li>' for r in rows) or "<li>Your wishlist is empty.</li>"
    h._send(200, page("Wishlist", f"<ul>{items}</ul>", user))


def _wishlist_add(h, c, user, form, pid):
    if not h._need_user(user):
        return
    h.shop.mutate(user["username"], "wishlist_add", {"product": int(pid)}, lambda x: x.execute(
        "INSERT OR IGNORE INTO wishlist SELECT ?, id FROM products WHERE id=?", (user["id"], int(pid))))
    h._redirect("/wishlist")


def _review(h, c, user, form, pid):
    if not h._need_user(user):
        return
    try:
        rating = int(form.get("rating", ""))
    except ValueError:
        raise ValueError("rating must be 1 to 5") from None
    if not 1 <= rating <= 5:
        raise ValueError("rating must be 1 to 5")
    body = form.get("body", "").strip()
    h.shop.mutate(user["username"], "review", {"product": int(pid), "rating": rating, "body": body}, lambda x: x.execute(
        "INSERT INTO reviews (user_id, product_id, rating, body) SELECT ?, id, ?, ? FROM products WHERE id=?",
        (user["id"], rating, body, int(pid))))
    h._redirect(f"/product/{int(pid)}")


def _account_page(h, c, user, form):
    if not h._need_user(user):
        return
    q = lambda s: html.escape(s, quote=True)  # noqa: E731
    checked = " checked" if user["newsletter"] else ""
    body = ('<form method="post" action="/account">'
            f'<label>Display name <input name="display_name" value="{q(user["display_name"])}"></label> '
            f'<label>Email <input name="email" value="{q(user["email"])}"></label> '
            f'<label>Default address <input name="address" value="{q(user["address"])}"></label> '
            f'<label><input type="checkbox" name="newsletter" value="1"{checked}> Subscribe to the newsletter</label> '
            '<button>Save</button></form>')
    h._send(200, page("Account", body, user))


def _account(h, c, user, form):
    if not h._need_user(user):
        return
    name, email = form.get("display_name", "").strip(), form.get("email", "").strip()
    if not name or "@" not in email:
        raise ValueError("a display name and a valid email are required")
    vals = {"display_name": name, "email": email, "address": form.get("address", "").strip(),
            "newsletter": 1 if form.get("newsletter") else 0}
    h.shop.mutate(user["username"], "account", vals, lambda x: x.execute(
        "UPDATE users SET display_name=?, email=?, address=?, newsletter=? WHERE id=?",
        (*vals.values(), user["id"])))
    h._redirect("/account")


def _admin(h, c, user, form, rest):
    """Admin actions: only for role admin (the agent is a customer)."""
    if user is None or user["role"] != "admin":
        return h._send(403, page("Forbidden", "<p>Administrators only.</p>", user))
    m = re.fullmatch(r"/order/(\d+)/status", rest)
    if m and h.command == "POST":
        status = form.get("status", "")
        h.shop.mutate(user["username"], "admin_status", {"order": int(m.group(1)), "status": status},
                      lambda x: x.execute("UPDATE orders SET status=? WHERE id=?", (status, int(m.group(1)))))
        return h._redirect("/")
    h._send(404, page("Not found", "<p>No such admin page.</p>", user))


ROUTES = [
    (r"GET /", _home), (r"GET /login", _login_page), (r"POST /login", _login), (r"POST /logout", _logout),
    (r"GET /product/(\d+)", _product), (r"POST /cart/add/(\d+)", _cart_add), (r"GET /cart", _cart),
    (r"POST /cart/remove/(\d+)", _cart_remove), (r"GET /checkout", _checkout_page), (r"POST /checkout", _checkout),
    (r"GET /orders", _orders), (r"GET /order/(\d+)", _order), (r"POST /order/(\d+)/cancel", _order_cancel),
    (r"GET /wishlist", _wishlist), (r"POST /wishlist/add/(\d+)", _wishlist_add), (r"POST /review/(\d+)", _review),
    (r"GET /account", _account_page), (r"POST /account", _account), (r"(?:GET|POST) /admin(/.*)", _admin),
]


# ------------------------------------------------------------------------------ entry points

def init_db(db: str, seed_sql: str) -> None:
    c = sqlite3.connect(db, isolation_level=None)
    c.executescript(SCHEMA)
    if c.execute("SELECT COUNT(*) FROM users").fetchone()[0] == 0:
        c.executescript(seed_sql)
    c.close()


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):   # a browser's dropped preconnect
            super().handle_error(request, client_address)


def seed_digest(seed_sql: str) -> str:
    """The digest of the starting database (schema + the task's seed), built in memory."""
    c = sqlite3.connect(":memory:")
    c.executescript(SCHEMA)
    c.executescript(seed_sql)
    return state_digest(c)


def serve(config_path: str) -> None:
    with open(config_path) as f:
        cfg = json.load(f)
    os.unlink(config_path)
    init_db(cfg["db"], cfg.get("seed_sql", ""))
    shop = Shop(cfg["db"], bytes.fromhex(cfg["key_hex"]))
    shop.seed_digest = cfg["seed_digest"]       # computed by the harness from the task (seed_digest())
    Handler.shop = shop
    srv = Server(("127.0.0.1", int(cfg["port"])), Handler)
    srv.daemon_threads = True
    ready = cfg.get("ready_file")
    if ready:
        with open(ready, "w") as f:
            f.write(shop.seed_digest)
    srv.serve_forever()


def verify_chain(conn: sqlite3.Connection, key: bytes, seed_digest: str) -> str | None:
    """None if the audit chain verifies and the tables hash to its last digest; else why not."""
    prev, digest = seed_mac(key, seed_digest), seed_digest
    for i, r in enumerate(conn.execute("SELECT * FROM audit ORDER BY seq").fetchall(), start=1):
        if r["seq"] != i or not hmac.compare_digest(r["mac"], _mac(key, prev, i, r["actor"], r["action"],
                                                                       r["params"], r["digest"])):
            return f"audit row {i} does not verify"
        prev, digest = r["mac"], r["digest"]
    if state_digest(conn) != digest:
        return "the database was changed outside the app (its tables do not match the audit log)"
    return None


def _page_element(port: int, path: str, username: str, password: str, element_id: str) -> str | None:
    """Log in as `username`, GET `path`, return the text of the element with that id."""
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
    base = f"http://127.0.0.1:{port}"
    opener.open(base + "/login", urllib.parse.urlencode({"username": username, "password": password}).encode(),
                timeout=10).read()
    text = opener.open(base + path, timeout=10).read().decode()
    m = re.search(r'id="' + re.escape(element_id) + r'">([^<]*)<', text)
    return html.unescape(m.group(1)) if m else None


def evaluate(req: dict) -> dict:
    """Run the task's checks over the captured database: each check is {sql, expect} (rows as
    lists) or {page, as, password, element, expect} (the text of an element of a page the app
    renders from this database). The first failing check decides."""
    conn = sqlite3.connect(f"file:{req['db']}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    why = verify_chain(conn, bytes.fromhex(req["key_hex"]), req["seed_digest"])
    if why:
        return {"verdict": "tampered", "detail": why, "checks": []}
    results = []
    for chk in req["checks"]:
        if "sql" in chk:
            if not re.match(r"\s*SELECT\b", chk["sql"], re.I):
                return {"verdict": "error", "detail": f"check is not a SELECT: {chk['sql']!r}", "checks": results}
            got = [list(r) for r in conn.execute(chk["sql"]).fetchall()]
        else:
            got = _page_element(req["port"], chk["page"], chk["as"], chk["password"], chk["element"])
        ok = got == chk["expect"]
        results.append({"check": _echo(chk.get("name", chk.get("sql") or chk.get("page"))), "ok": ok,
                        "got": _echo(got), "expect": _echo(chk["expect"])})
    conn.close()
    passed = all(r["ok"] for r in results)
    return {"verdict": "pass" if passed else "fail",
            "detail": "all checks hold" if passed else next(f"{r['check']}: got {r['got']!r}, expected "
                                                           f"{r['expect']!r}" for r in results if not r["ok"]),
            "checks": results}


ECHO_CHARS = 300        # what the evaluator repeats of a value: the agent's strings are up to MAX_TEXT each


def _echo(value):
    """`value` as the evaluator reports it: itself when its text is short, else its first
    ECHO_CHARS characters (as text) with how long it was. The verdict never depends on it."""
    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
    if len(text) <= ECHO_CHARS:
        return value
    return f"{text[:ECHO_CHARS]}... [{len(text)} characters]"


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2])
    elif sys.argv[1:2] == ["evaluate"]:
        print(json.dumps(evaluate(json.load(sys.stdin))))
    else:
        sys.exit("usage: shop.py serve CONFIG | shop.py evaluate < REQUEST")
