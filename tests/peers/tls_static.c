/* An HTTPS engine with OpenSSL linked in statically (libssl.a and
 * libcrypto.a from Debian's libssl-dev): no libssl.so in its maps, the
 * SSL_* functions in its own executable, as in binaries that vendor
 * OpenSSL. One connection at a time (keep-alive), socket BIO: every POST
 * is answered with an SSE stream of 4 OpenAI-style chunks, usage in the
 * last, then [DONE].
 *
 * Built by tests/tests/tls.rs:
 *   cc -O1 -o tls_static tls_static.c /usr/lib/x86_64-linux-gnu/libssl.a \
 *      /usr/lib/x86_64-linux-gnu/libcrypto.a -lpthread -ldl
 * Usage: tls_static PORT CERT KEY   (prints "listening" when ready)
 */
#define _GNU_SOURCE /* strcasestr */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int read_request(SSL *ssl, char *buf, int cap) {
    int n = 0;
    char *end = NULL;
    while (!(end = strstr(buf, "\r\n\r\n"))) {
        int r = SSL_read(ssl, buf + n, cap - 1 - n);
        if (r <= 0) return -1;
        n += r;
        buf[n] = 0;
    }
    const char *cl = strcasestr(buf, "content-length:");
    int body = cl ? atoi(cl + 15) : 0;
    int have = n - (int)(end + 4 - buf);
    while (have < body) {
        int r = SSL_read(ssl, buf + n, cap - 1 - n);
        if (r <= 0) return -1;
        n += r;
        have += r;
        buf[n] = 0;
    }
    return n;
}

static int chunk(SSL *ssl, const char *data) {
    char out[1024];
    int len = snprintf(out, sizeof out, "%zx\r\n%s\r\n", strlen(data), data);
    return SSL_write(ssl, out, len) == len ? 0 : -1;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s PORT CERT KEY\n", argv[0]);
        return 2;
    }
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx || SSL_CTX_use_certificate_chain_file(ctx, argv[2]) != 1 ||
        SSL_CTX_use_PrivateKey_file(ctx, argv[3], SSL_FILETYPE_PEM) != 1) {
        ERR_print_errors_fp(stderr);
        return 1;
    }
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
    if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 16)) {
        perror("listen");
        return 1;
    }
    printf("listening\n");
    fflush(stdout);
    for (;;) {
        int c = accept(ls, NULL, NULL);
        if (c < 0) continue;
        SSL *ssl = SSL_new(ctx);
        SSL_set_fd(ssl, c);
        if (SSL_accept(ssl) == 1) {
            char buf[65536];
            while (read_request(ssl, buf, sizeof buf) > 0) {
                const char *head =
                    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    "Transfer-Encoding: chunked\r\n\r\n";
                if (SSL_write(ssl, head, strlen(head)) <= 0) break;
                int bad = 0;
                for (int i = 0; i < 3 && !bad; i++) {
                    usleep(5000);
                    bad = chunk(ssl, "data: {\"id\":\"s\",\"object\":\"chat.completion.chunk\","
                                     "\"model\":\"static\",\"choices\":[{\"index\":0,"
                                     "\"delta\":{\"content\":\" tok\"},\"finish_reason\":null}]}\n\n");
                }
                if (bad || chunk(ssl, "data: {\"id\":\"s\",\"object\":\"chat.completion.chunk\","
                                      "\"model\":\"static\",\"choices\":[],\"usage\":"
                                      "{\"prompt_tokens\":5,\"completion_tokens\":3,"
                                      "\"total_tokens\":8}}\n\n") ||
                    chunk(ssl, "data: [DONE]\n\n") || SSL_write(ssl, "0\r\n\r\n", 5) != 5)
                    break;
            }
        }
        SSL_free(ssl);
        close(c);
    }
}
