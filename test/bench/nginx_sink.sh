# nginx_sink.sh — sourced by the shell benchmarks: start_nginx DIR PORT starts
# one nginx worker answering `return 200 "ok"` over keep-alive on
# 127.0.0.1:PORT, with its files under DIR (pid in DIR/nginx.pid), and waits
# for its pid file.  (bench.py has its own, in Python.)
start_nginx() {
    local dir=$1 port=$2
    mkdir -p "$dir/nginx/logs"
    cat > "$dir/nginx.conf" <<CONF
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/nginx/logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    client_body_temp_path $dir/nginx/body;
    proxy_temp_path $dir/nginx/proxy;
    fastcgi_temp_path $dir/nginx/fastcgi;
    uwsgi_temp_path $dir/nginx/uwsgi;
    scgi_temp_path $dir/nginx/scgi;
    server { listen 127.0.0.1:$port; location / { return 200 "ok"; } }
}
CONF
    nginx -c "$dir/nginx.conf" -p "$dir/nginx" -e "$dir/nginx/logs/error.log" 2>/dev/null
    for _ in $(seq 50); do [ -s "$dir/nginx.pid" ] && return 0; sleep 0.1; done
    echo "nginx did not start (see $dir/nginx/logs/error.log)" >&2
    return 1
}
